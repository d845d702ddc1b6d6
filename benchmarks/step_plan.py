"""The memory plan (``reasonrl.memory.plan_memory``) of a ``gpu_grpo_step.py`` configuration, predicted on this
machine for an H200, and set against a step JSON's measured peaks per phase -> JSON.

    python benchmarks/step_plan.py [--device-gib 139.8] [--measured STEP.json] --out PLAN.json -- STEP_ARGS...

``STEP_ARGS`` are the step script's own flags (``--shape``, ``--response-len``, ``--set KEY=VALUE`` ...): the config
is built by the same ``config_overrides`` and ``load_config`` (as on a GPU), so the plan is the one the trainer
checks before it loads. With ``--measured``, each phase's plan total stands beside the step's peak of torch's
allocator in that phase (the last step's ``memory_gib``) and its device memory in
use at the phase's end; the allocator peak counts vLLM's sleep-mode pool even while unmapped (``notes`` of the step
JSON), so in the phases where the engine sleeps the device's used memory is the closer reading.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path


from reasonrl.bench.records import write  # noqa: E402
from reasonrl.bench.shapes import GIB, SHAPES  # noqa: E402
from gpu_grpo_step import config_overrides, parse_args  # noqa: E402

STEP_PHASE = {"rollout": "rollout", "log_probs": "old_log_probs", "reference": "ref_log_probs",
              "update": "update_actor", "weight_sync": "weight_sync"}
"""The plan's phase -> the step JSON's phase (``reasonrl.bench.probes.PHASE_OF_CALL``)."""


def predicted(step_argv, device_gib: float):
    """Per phase of the plan: total GiB and its terms (GiB), for the step configuration ``step_argv``."""
    from reasonrl.config import load_config
    from reasonrl.config.device_defaults import Hardware
    from reasonrl.config.plan import RunPlan
    from reasonrl.memory import plan_memory

    args = parse_args(step_argv)
    model_dir = Path("/tmp/reasonrl-bench-model") / f"{args.shape}-trainer"
    cfg, _ = load_config(config_overrides(args, model_dir, Path("/tmp/prompts.jsonl"), Path("/tmp/run"), True),
                         cuda_available=True)
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, num_workers=args.workers),
                              rollout=dataclasses.replace(cfg.rollout, tensor_parallel_size=args.tp))
    run = RunPlan.build(cfg, Hardware("cuda", args.workers))
    plan = plan_memory(cfg, SHAPES[args.shape], device_gib * GIB, run,
                       old_log_prob_pass=True if args.old_log_prob_pass == "always" else None)
    return {p.name: {"total_gib": p.total / GIB, "terms_gib": {k: v / GIB for k, v in p.terms.items()},
                     "fits": p.fits} for p in plan.phases}, plan.notes


def measured(step_json: Path):
    """Per phase of a step JSON: the largest allocator peak and device memory in use over its ranks, GiB."""
    data = json.loads(step_json.read_text())
    last = (data.get("steps") or data.get("warmup_steps") or [{}])[-1]
    out = {}
    for phase, ranks in (last.get("memory_gib") or {}).items():
        out[phase] = {"peak_allocated_gib": max(r.get("peak_allocated_gib", 0.0) for r in ranks),
                      "device_used_gib_at_end": max(r.get("device_used_gib", 0.0) for r in ranks)}
    return out


def main() -> None:
    argv = sys.argv[1:]
    step_argv = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device-gib", type=float, default=139.8, help="the H200's memory as torch reports it")
    p.add_argument("--measured", type=Path, default=None, help="a gpu_grpo_step.py JSON of the same flags")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(own)
    phases, notes = predicted(step_argv, args.device_gib)
    result = {"benchmark": "step_plan", "step_args": step_argv, "device_gib": args.device_gib, "plan": phases,
              "plan_notes": notes}
    if args.measured:
        got = measured(args.measured)
        result["measured_from"] = str(args.measured)
        result["plan_vs_measured"] = {
            name: {"plan_gib": ph["total_gib"], **got.get(STEP_PHASE.get(name, name), {})} for name, ph in phases.items()}
    write(args.out, result)
    for name, ph in phases.items():
        m = result.get("plan_vs_measured", {}).get(name, {})
        print(f"{name:12s} plan {ph['total_gib']:7.1f} GiB  fits {ph['fits']}  measured peak "
              f"{m.get('peak_allocated_gib', float('nan')):7.1f}  used at end {m.get('device_used_gib_at_end', float('nan')):7.1f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
