"""Catch the first non-finite gradient of a real GRPO run on ``arith`` and name the operation that made it.

    PYTHONPATH=$PWD python3 benchmarks/gpu_nan_probe.py --out $OUT/nan_probe.json --deadline-s 500

The run is the recorded one of benchmarks/README.md ("the NaN's source"): SmolLM2-135M-Instruct, the hf engine,
``gpu_run.sh``'s ``TRAIN`` (32 prompts x 8, T = 0.7, lr 1e-5, 4 mini-batches per step), grpo without KL, seed 2
(the seed whose steps went non-finite from step 37), with the device's defaults (bf16 and ``sdpa`` on a GPU). It is
``Trainer.train_step`` itself, in this process (the in-process backend, one worker, no Ray), with the actor worker
``reasonrl.bench.nan_worker.NanProbeWorker``: it trains unchanged and watches each micro-batch's gradients. After the
first step whose update met a non-finite gradient the training stops and the worker analyses that micro-batch
(``nan_worker``'s docstring: the traced replay on the actor, the bf16/fp32 x SDPA-backend/eager replays, the padding
facts). Before training, ``nan_trace.masked_row_sdpa_grads`` tests SDPA alone on fully masked query rows in bf16 and
fp32 on this device (seconds).

``--dry-run`` (the CPU check): 2 prompts x 2 samples, 24 new tokens, 2 steps at most, no validation; with
``--inject-nan MODULE`` that module's backward emits NaN, so the whole capture and analysis path runs and the JSON's
``analysis.actor_trace.culprit`` must name MODULE. Extra ``KEY=VALUE`` overrides after ``--`` win over the defaults.

The JSON (written whatever happens, ``reasonrl.bench.records.recorded``): ``steps`` (per step: reward, entropy,
gradient norm, skipped optimizer steps, seconds), ``captured`` (where), ``analysis`` and ``sdpa_masked_rows``.
The captured micro-batch goes beside the JSON (``micro_batch.pt``, small); the model state to ``--capture-dir``
(``model_state.pt``, ~0.5 GiB in fp32: it stays on the machine).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import torch

from reasonrl.bench.records import RESULTS, exit_with_status, recorded, write

TRAIN = ["rollout.engine=hf", "data.train_batch_size=32", "rollout.n=8", "rollout.temperature=0.7", "actor.lr=1e-5",
         "actor.ppo_mini_batch_size=8", "actor.micro_batch_size_per_worker=64", "reward.workers=2",
         "algorithm.use_kl_loss=false", "model.attn_implementation=sdpa", "actor.use_packing=false"]
"""benchmarks/gpu_run.sh's ``TRAIN`` and grpo's ``EXTRA`` (the recorded configuration), with the attention and padding
the recorded runs had: sdpa on padded rows (the GPU's defaults are now varlen on packed rows)."""
DRY_RUN = ["data.train_batch_size=2", "rollout.n=2", "rollout.max_new_tokens=24", "actor.ppo_mini_batch_size=1",
           "actor.micro_batch_size_per_worker=2", "reward.workers=1"]
"""``--dry-run``'s overrides, after ``TRAIN``: a step of seconds on a CPU."""
STEP_KEYS = ("reward/mean", "actor/entropy", "actor/grad_norm", "actor/skipped_optimizer_steps", "actor/pg_loss",
             "response_length/mean", "timing_s/step")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None,
                   help="JSON path (default $OUT/nan_probe.json when $OUT is set, else benchmarks/results/)")
    p.add_argument("--capture-dir", type=Path, default=Path("/tmp/nan_capture"),
                   help="where the captured model state is saved (model_state.pt)")
    p.add_argument("--runs-dir", type=Path, default=Path("/tmp/nan_probe_run"), help="the trainer's output folder")
    p.add_argument("--seed", type=int, default=2, help="trainer.seed and rollout.seed (2: the recorded NaN seed)")
    p.add_argument("--max-steps", type=int, default=150, help="stop after this many steps without a capture")
    p.add_argument("--deadline-s", type=float, default=500.0,
                   help="wall seconds from start: no step starts that would end after deadline - reserve")
    p.add_argument("--reserve-s", type=float, default=90.0, help="seconds kept for the analysis after the last step")
    p.add_argument("--threads", type=int, default=4, help="torch CPU threads of the in-process worker")
    p.add_argument("--dry-run", action="store_true", help="tiny batches, 2 steps at most (the CPU check)")
    p.add_argument("--inject-nan", default="", metavar="MODULE",
                   help="make MODULE's backward emit NaN (e.g. model.layers.3.mlp.down_proj)")
    p.add_argument("--no-save-state", action="store_true", help="do not write model_state.pt")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE overrides for the trainer (after --)")
    args = p.parse_args(argv)
    if args.out is None:
        args.out = Path(os.environ["OUT"]) / "nan_probe.json" if os.environ.get("OUT") else RESULTS / "nan_probe.json"
    if args.dry_run:
        args.max_steps = min(args.max_steps, 2)
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        p.error(f"not KEY=VALUE overrides: {bad}")
    return args


def trainer_overrides(args, train_file: Path) -> List[str]:
    """The trainer's overrides: the recorded configuration (``--dry-run``: tiny), no validation, no checkpoints."""
    return ["task=arith", "algorithm=grpo", f"trainer.seed={args.seed}", f"rollout.seed={args.seed}",
            f"trainer.total_steps={args.max_steps}", "trainer.val_before_train=false", "trainer.val_every=0",
            "trainer.save_every=0", "trainer.resume=never", "trainer.logger=[jsonl]", "trainer.num_workers=1",
            f"trainer.output_dir={args.runs_dir}", f"data.train_files=[{train_file}]", *TRAIN,
            *(DRY_RUN if args.dry_run else []), *args.overrides]


def step_row(step: int, metrics: Dict[str, Any], seconds: float) -> Dict[str, Any]:
    row = {"step": step, "seconds": round(seconds, 2)}
    row.update({k: metrics[k] for k in STEP_KEYS if k in metrics})
    return row


def main(argv=None) -> None:
    wall_start = time.perf_counter()
    args = parse_args(argv)
    result: Dict[str, Any] = {"benchmark": "gpu_nan_probe", "argv": sys.argv[1:] if argv is None else argv,
                              "dry_run": args.dry_run, "inject_nan": args.inject_nan, "steps": []}
    with recorded(args.out, result, wall_start):
        run(args, result, wall_start)
    exit_with_status(result)


def run(args, result: Dict[str, Any], wall_start: float) -> None:
    from reasonrl.bench.nan_trace import masked_row_sdpa_grads
    from reasonrl.bench.nan_worker import NanProbeWorker
    from reasonrl.config import load_config
    from reasonrl.datasets import prepare
    from reasonrl.trainer.backends import InProcessBackend
    from reasonrl.config.plan import RunPlan
    from reasonrl.hardware import local_hardware
    from reasonrl.trainer.trainer import Trainer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    result["machine"] = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0) if device == "cuda"
                         else "cpu", "transformers": __import__("transformers").__version__}
    result["sdpa_masked_rows"] = [masked_row_sdpa_grads(device, dt) for dt in (torch.bfloat16, torch.float32)]
    write(args.out, result)
    train_file = prepare("arith", "train", out_dir=args.runs_dir / "data")
    overrides = trainer_overrides(args, train_file)
    result["overrides"] = overrides
    cfg, _ = load_config(overrides)
    result["config"] = {"dtype": cfg.model.dtype, "attn_implementation": cfg.model.attn_implementation,
                        "device": cfg.trainer.device}
    plan = RunPlan.build(cfg, local_hardware(cfg.trainer.device))
    trainer = Trainer(cfg, plan, InProcessBackend(actor_worker=NanProbeWorker, num_threads=args.threads))
    try:
        result["model"] = trainer.workers.nan_probe_setup(args.inject_nan)
        result["startup_s"] = round(time.perf_counter() - wall_start, 1)
        print(f"nan probe: worker up in {result['startup_s']} s: {result['model']}", flush=True)
        last = 0.0
        for step in range(args.max_steps):
            if time.perf_counter() - wall_start + 1.5 * last + args.reserve_s > args.deadline_s:
                result["stopped"] = f"deadline: no capture in {step} steps"
                break
            t0 = time.perf_counter()
            metrics = trainer.train_step()
            trainer.step += 1  # as Trainer.fit does after each step
            last = time.perf_counter() - t0
            result["steps"].append(step_row(trainer.step, metrics, last))
            print("nan probe step", result["steps"][-1], flush=True)
            captured = trainer.workers.nan_probe_captured()
            write(args.out, result)
            if captured:
                result["captured"] = {"step": trainer.step, **captured}
                break
        else:
            result["stopped"] = f"no non-finite gradient in {args.max_steps} steps"
        if "captured" in result:
            print(f"nan probe: captured {result['captured']}; analysing", flush=True)
            analysis = trainer.workers.nan_probe_analyse(str(args.capture_dir), not args.no_save_state)
            import shutil  # the micro-batch (small) travels with the JSON

            shutil.copy(Path(analysis["capture_dir"]) / "micro_batch.pt", args.out.parent / "micro_batch.pt")
            result["analysis"] = analysis
            trace = analysis["actor_trace"]
            print(f"nan probe: culprit {trace.get('culprit')}; first non-finite gradient "
                  f"{trace.get('first_nonfinite_grad')}; variants with non-finite grads: "
                  f"{[(v['dtype'], v['attn'], v['sdpa_backend']) for v in analysis['variants'] if v.get('nonfinite')]}",
                  flush=True)
    finally:
        trainer.close()


if __name__ == "__main__":
    main()
