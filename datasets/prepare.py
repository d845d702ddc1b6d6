"""python -m reasonrl.datasets.prepare TASK [--split S] [--data-dir DIR] [--out DIR]: write a task's parquet."""
from __future__ import annotations

import argparse
from pathlib import Path

from . import TASKS, get_task, prepare


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--split", action="append", help="split(s) to prepare (default: the task's train and val)")
    parser.add_argument("--data-dir", type=Path, default=None, help="folder with the upstream files (default: Hub)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: the reasonrl cache)")
    args = parser.parse_args(argv)
    spec = get_task(args.task)
    for split in args.split or sorted({spec.train_split, spec.val_split}):
        path = prepare(spec.recipe, split, args.data_dir, args.out)
        print(f"{args.task} {split}: {path}")


if __name__ == "__main__":
    main()
