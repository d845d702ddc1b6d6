"""``python -m reasonrl.train task=gsm8k [key=value ...]`` — train a policy with RL from verifiable rewards."""
from __future__ import annotations

import logging
import os
import sys
from typing import List, Optional


def print_header(cfg, notes, world_size: int, device: Optional[str] = None) -> None:
    """The start-up table: presets, the effective config (per-device settings resolved for ``device``, default:
    the run's), the per-device settings with why, and the derived batch sizes."""
    from reasonrl.config import to_yaml
    from reasonrl.config.device_defaults import apply_device_defaults
    from reasonrl.config.passes import pass_rows
    from reasonrl.trainer.run_plan import batch_size_table, resolve_device

    device = device or resolve_device(cfg)
    settings = apply_device_defaults(cfg, device)

    if notes.get("profile") == "cpu":
        print("reasonrl: no GPU — using the CPU profile (small batch and lengths; set trainer.profile=none or give "
              "sizes to change it)", flush=True)
    print(f"reasonrl: task={notes['task']} algorithm={notes['algorithm']} model={cfg.model.path}", flush=True)
    print("---- effective config ----")
    print(to_yaml(cfg).rstrip())
    print(f"---- per-device settings ({device}) ----")
    key_w = max(len(s.key) for s in settings)
    for s in settings:
        print(f"  {s.key:<{key_w}}  {str(s.value).lower() if isinstance(s.value, bool) else s.value}  ({s.why})")
    print("---- batch sizes ----")
    rows = batch_size_table(cfg, world_size) + pass_rows(cfg)
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
    from reasonrl.trainer.run_plan import check_divisibility, resolve_device, world_size_for
    from reasonrl.trainer.trainer import Trainer

    device = resolve_device(cfg)
    world = world_size_for(cfg, device)
    print_header(cfg, notes, world, device)
    try:
        check_divisibility(cfg, world)
    except ValueError as exc:
        print(f"reasonrl: config error: {exc}", file=sys.stderr)
        return 2
    from reasonrl.doctor import check_requirements

    problems = check_requirements(cfg)
    if problems:
        for p in problems:
            print(f"reasonrl: missing requirement: {p}", file=sys.stderr)
        return 3
    from reasonrl.datasets import DataError
    from reasonrl.models.loader import ModelNotFoundError
    from reasonrl.trainer.checkpoint import CheckpointError
    from reasonrl.interrupt import EXIT_INTERRUPTED
    from reasonrl.trainer.failures import EXIT_HALTED, RunHaltedError
    from reasonrl.trainer.watchdog import EXIT_HUNG, PhaseHangError

    from reasonrl.workers.actor_rollout_ref import ActorRolloutRefWorker
    from reasonrl.workers.critic import CriticWorker

    try:
        if cfg.trainer.mode == "async":  # rollout workers on their own devices, one step ahead (docs/async.md)
            from reasonrl.trainer.async_loop import AsyncTrainer
            from reasonrl.workers.rollout_worker import RolloutWorker

            trainer = AsyncTrainer(cfg, actor_worker=ActorRolloutRefWorker, rollout_worker=RolloutWorker)
        else:
            trainer = Trainer(cfg, actor_worker=ActorRolloutRefWorker, critic_worker=CriticWorker)
    except ConfigError as exc:  # a fact of the model or data the config does not fit (e.g. its context length)
        print(f"reasonrl: config error: {exc}", file=sys.stderr)
        return 2
    except (DataError, ModelNotFoundError, CheckpointError) as exc:
        print(f"reasonrl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("reasonrl: interrupted while starting; nothing was trained", file=sys.stderr)
        return EXIT_INTERRUPTED
    try:
        trainer.fit()
    except PhaseHangError:  # the watchdog printed the phase, the ranks and their stacks
        return EXIT_HUNG
    except RunHaltedError as exc:  # no verdicts, or nothing trained: stop loudly (the last checkpoint stays)
        print(f"reasonrl: stopped: {exc}", file=sys.stderr)
        return EXIT_HALTED
    except KeyboardInterrupt:  # a second Ctrl-C: the step in flight is dropped
        print(f"reasonrl: aborted without saving; the last complete checkpoint is the resume point "
              f"({trainer.run_dir / 'checkpoints'})", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        trainer.close()
    if trainer.interrupted:
        print(f"reasonrl: interrupted — step {trainer.step} saved in {trainer.run_dir / 'checkpoints'}; run the same "
              "command again to resume", flush=True)
        return EXIT_INTERRUPTED
    print(f"reasonrl: done — {trainer.step} steps; metrics in {trainer.run_dir / 'metrics.jsonl'}; "
          f"checkpoints in {trainer.run_dir / 'checkpoints'}", flush=True)
    return 0

if __name__ == "__main__":
    sys.exit(main())
