"""``python -m reasonrl.train task=gsm8k [key=value ...]`` — train a policy with RL from verifiable rewards."""
from __future__ import annotations

import logging
import os
import sys
from typing import List, Optional


def print_header(cfg, notes, plan) -> None:
    """The start-up table: presets, the effective config (the plan's ``run_config``: per-device settings resolved for
    its device), the per-device settings with why, and the derived batch sizes and passes."""
    from reasonrl.config import to_yaml
    from reasonrl.config.passes import pass_rows
    from reasonrl.config.presets import profile_notice

    settings = plan.device_settings
    notice = profile_notice(notes.get("profile") or "", notes["task"])
    if notice:
        print(notice, flush=True)
    print(f"reasonrl: task={notes['task']} algorithm={notes['algorithm']} model={cfg.model.path}", flush=True)
    print("---- effective config ----")
    print(to_yaml(plan.run_config(cfg)).rstrip())
    print(f"---- per-device settings ({plan.device}) ----")
    key_w = max(len(s.key) for s in settings)
    for s in settings:
        print(f"  {s.key:<{key_w}}  {str(s.value).lower() if isinstance(s.value, bool) else s.value}  ({s.why})")
    print("---- batch sizes ----")
    rows = plan.batch.table() + pass_rows(plan.passes)
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    print("-" * (width + 10), flush=True)


def main(argv: Optional[List[str]] = None, backend=None) -> int:
    """The command; ``backend`` runs the worker groups (default: Ray; ``trainer.backends.InProcessBackend`` for the
    benchmarks' in-process driver)."""
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
    from reasonrl.config.plan import RunPlan
    from reasonrl.hardware import local_hardware

    try:  # every derived fact and every rule between features, before anything starts
        plan = RunPlan.build(cfg, local_hardware(cfg.trainer.device))
    except ConfigError as exc:
        print(f"reasonrl: config error: {exc}", file=sys.stderr)
        return 2
    from reasonrl.trainer.checkpoint import finished_step

    done_at = finished_step(cfg.trainer.output_dir, cfg.trainer.resume, cfg.trainer.total_steps)
    if done_at is not None:  # before Ray, the engines or the model: a finished run says so in seconds
        print(f"reasonrl: run complete at step {done_at} (a verified checkpoint in "
              f"{cfg.trainer.output_dir}/checkpoints); raise trainer.total_steps to continue", flush=True)
        return 0
    from reasonrl.doctor import check_requirements

    problems = check_requirements(cfg)  # before the config table, so the error is the last thing printed
    if problems:
        for p in problems:
            print(f"reasonrl: {'error' if p.bad_input else 'missing requirement'}: {p}", file=sys.stderr)
        return 2 if any(p.bad_input for p in problems) else 3
    print_header(cfg, notes, plan)
    from reasonrl.controller.ray_head import stop_local_head

    try:
        return train(cfg, plan, backend)
    finally:  # the local Ray head (own_session) stops with the run, whatever ended it
        stop_local_head()


def train(cfg, plan, backend) -> int:
    """Start the workers, train, and say how the run ended (its exit status)."""
    from reasonrl.config import ConfigError
    from reasonrl.datasets import DataError
    from reasonrl.models.loader import ModelNotFoundError
    from reasonrl.trainer.checkpoint import CheckpointError, resume_point
    from reasonrl.interrupt import EXIT_INTERRUPTED
    from reasonrl.trainer.failures import EXIT_HALTED, RunHaltedError
    from reasonrl.trainer.watchdog import EXIT_HUNG, PhaseHangError
    from reasonrl.fleet.health import RestartBudgetSpent
    from reasonrl.fleet.weight_check import StaleReplicaError, UncheckedReplicaError

    from reasonrl.controller.placement import ClusterTooSmallError
    from reasonrl.trainer.backends import RayBackend
    from reasonrl.trainer.trainer import Trainer

    from reasonrl.controller import ray_head

    ray_head.on_lost = lambda: ray_stopped_under_the_run(trainer_of, str(cfg.trainer.output_dir))
    trainer_of: list = []  # the trainer, once built (Ray may stop before)
    try:  # trainer.mode=async: rollout workers of their own (docs/async.md)
        trainer = Trainer(cfg, plan, backend or RayBackend(own_session=True))
    except ConfigError as exc:  # a fact of the model or data the config does not fit (e.g. its context length)
        print(f"reasonrl: config error: {exc}", file=sys.stderr)
        return 2
    except (DataError, ModelNotFoundError, CheckpointError, ClusterTooSmallError) as exc:
        print(f"reasonrl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("reasonrl: interrupted while starting; nothing was trained", file=sys.stderr)
        return EXIT_INTERRUPTED
    trainer_of.append(trainer)
    run_dir = str(trainer.run_dir)
    try:
        trainer.fit()
    except PhaseHangError:  # the watchdog printed the phase, the ranks and their stacks
        return EXIT_HUNG
    except (RestartBudgetSpent, StaleReplicaError, UncheckedReplicaError) as exc:  # fleet.enabled: a replica needed replacing past
        # fleet.max_restarts, or the weight-sync check found one holding old weights
        print(f"reasonrl: stopped: {exc}", file=sys.stderr)
        return exc.exit_status
    except RunHaltedError as exc:  # no verdicts, or nothing trained: stop loudly (the last checkpoint stays)
        print(f"reasonrl: stopped: {exc}", file=sys.stderr)
        return EXIT_HALTED
    except KeyboardInterrupt:  # a second Ctrl-C/SIGTERM: the step in flight is dropped
        print(f"reasonrl: aborted without saving the step in flight; {resume_point(run_dir)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if not trainer.stop_signal:
            raise
        # asked to stop, then the step failed: a signal to the whole job (Slurm, systemd) also stopped Ray's processes
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        ray_head.on_lost = None  # said here; the workers are gone, nothing of theirs to close
        print(f"reasonrl: {trainer.stop_signal}: the step in flight was lost, its workers stopped with the run "
              f"({type(exc).__name__}: {reason}); {resume_point(run_dir)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if ray_head.on_lost is not None:
            trainer.close()
    if trainer.interrupted:
        print(f"reasonrl: interrupted — step {trainer.step} saved in {trainer.run_dir / 'checkpoints'}; run the same "
              "command again to resume", flush=True)
        return EXIT_INTERRUPTED
    print(f"reasonrl: done — {trainer.step} steps; metrics in {trainer.run_dir / 'metrics.jsonl'}; "
          f"checkpoints in {trainer.run_dir / 'checkpoints'}", flush=True)
    return 0


def ray_stopped_under_the_run(trainer_of: list, run_dir: str) -> None:
    """The local Ray head exited while the run used it (SIGTERM to every process of the job): the step in flight is
    lost; say where a resume starts, and exit now (130 when a signal asked the run to stop, else 1)."""
    from reasonrl.interrupt import EXIT_INTERRUPTED
    from reasonrl.trainer.checkpoint import resume_point

    sig = trainer_of[0].stop_signal if trainer_of else ""
    print(f"reasonrl: {sig or 'stopped'}: Ray's processes were stopped under the run, so the step in flight was "
          f"lost; {resume_point(run_dir)}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(EXIT_INTERRUPTED if sig else 1)


if __name__ == "__main__":
    sys.exit(main())
