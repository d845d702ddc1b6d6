"""``python -m reasonrl.train task=gsm8k [key=value ...]`` — train a policy with RL from verifiable rewards."""
from __future__ import annotations

import logging
import os
import sys
from typing import List, Optional


def print_header(cfg, notes, world_size: int) -> None:
    from reasonrl.config import to_yaml
    from reasonrl.trainer.trainer import batch_size_table

    if notes.get("profile") == "cpu":
        print("reasonrl: no GPU — using the CPU profile (small batch and lengths; set trainer.profile=none or give "
              "sizes to change it)", flush=True)
    print(f"reasonrl: task={notes['task']} algorithm={notes['algorithm']} model={cfg.model.path}", flush=True)
    print("---- effective config ----")
    print(to_yaml(cfg).rstrip())
    print("---- batch sizes ----")
    rows = batch_size_table(cfg, world_size)
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    print("-" * (width + 10), flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        print("Keys: see docs/configuration.md (python -m reasonrl.config.docs). Presets: task=, algorithm=.")
        return 0
    logging.basicConfig(level=os.environ.get("REASONRL_LOG", "WARNING"), format="%(levelname)s %(name)s: %(message)s")
    from reasonrl.config import ConfigError, load_config

    try:
        cfg, notes = load_config(argv)
    except ConfigError as exc:
        print(f"reasonrl: config error: {exc}", file=sys.stderr)
        return 2
    from reasonrl.trainer.trainer import Trainer, check_divisibility, resolve_device, world_size_for

    device = resolve_device(cfg)
    world = world_size_for(cfg, device)
    print_header(cfg, notes, world)
    try:
        check_divisibility(cfg, world)
    except ValueError as exc:
        print(f"reasonrl: config error: {exc}", file=sys.stderr)
        return 2
    try:
        from reasonrl.doctor import check_requirements
    except ImportError:
        check_requirements = None
    if check_requirements is not None:
        problems = check_requirements(cfg)
        if problems:
            for p in problems:
                print(f"reasonrl: missing requirement: {p}", file=sys.stderr)
            return 3
    trainer_cls = Trainer
    if cfg.trainer.mode == "async":  # rollout workers on their own devices, one step ahead (docs/async.md)
        from reasonrl.trainer.async_loop import AsyncTrainer as trainer_cls
    trainer = trainer_cls(cfg)
    try:
        trainer.fit()
    finally:
        trainer.close()
    print(f"reasonrl: done — {trainer.step} steps; metrics in {trainer.run_dir / 'metrics.jsonl'}; "
          f"checkpoints in {trainer.run_dir / 'checkpoints'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
