"""Training in an environment: what the real model does with the ``search`` and ``code_feedback`` environments over
the steps of a short run (docs/environments.md, "Evidence").

    python benchmarks/env_learning.py --task search --steps 20 --val-every 10 --val-size 32 \\
        -- rollout.engine=hf data.train_batch_size=8 rollout.n=4
    python benchmarks/env_learning.py --task code_feedback ...   # needs mbpp_sanitized.jsonl (docs/tasks.md)

One seed runs ``python -m reasonrl.train task=<task> algorithm=<algo> ...`` through benchmarks/learning_curve.py's
machinery (the same command line, ``--driver``, ``--time-limit-s``; validation before training and every
``--val-every`` steps on ``--val-size`` held-out prompts, greedy). The script then reads the run's ``metrics.jsonl``
and writes ``benchmarks/results/env_learning_<task>.json`` and ``.png``:

* ``per_step``: one row per training step with the reward and accuracy, and the environment's metrics
  (``reasonrl.envs.metrics.env_metrics``: turns per trajectory, calls per tool, malformed calls, failures, drift,
  the environment's reward and its agreement with the verifier; for ``code_feedback`` the share of trajectories
  whose first submission failed and a later one passed, ``env/code_feedback/fixed``, and ``fix_rate``) plus the tool
  loop's (``tool/*``) and the step's seconds;
* ``validation``: held-out accuracy at each validation (``[step, accuracy]``); ``validation_env``: at each one the
  held-out tool-call rate (``val/env/call_rate``: the share of held-out trajectories with at least one well-formed
  call) and drift rate (``val/env/drift_rate``), ``reasonrl.envs.metrics.val_env_metrics``;
* ``summary``: each tracked metric's mean over the first and the last ``--window`` steps, and the held-out accuracy
  at the start and the end with the binomial standard error of their difference (learning_curve.summarize), and
  the held-out call rate at the start and the end (``val_call_rate_step0``, ``val_call_rate_final``).

``--reuse`` reads the run's metrics again (to rewrite the JSON and plot) and keeps the wall time and the stop that the
JSON already at ``--out`` recorded for the run that trained.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import learning_curve as lc  # noqa: E402  (benchmarks/ is not a package)

ROOT = lc.ROOT
TASKS = ("search", "search_example", "search_examples", "search_hops", "code_feedback")
STEP_KEYS = ("reward/mean", "reward/accuracy", "response/length_mean", "timing_s/step", "actor/kl", "actor/entropy")
"""Per-step metrics kept besides every ``env/*`` and ``tool/*`` one."""
SUMMARY_KEYS = ("reward/mean", "reward/accuracy", "env/turns_mean", "env/call_rate", "env/calls_per_trajectory", "env/calls/search",
                "env/calls/python", "env/malformed_calls", "env/failed", "env/drift_rate", "env/reward_mean",
                "env/reward_verifier_agreement", "env/code_feedback/first_passed", "env/code_feedback/first_failed",
                "env/code_feedback/fixed", "env/code_feedback/fix_rate", "tool/error_rate", "response/length_mean")
"""The metrics the summary compares between the first and the last steps (those the run logged)."""


def per_step(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The training steps' rows (those with a reward), each cut to ``STEP_KEYS`` and the ``env/*``, ``tool/*``
    metrics."""
    out = []
    for r in rows:
        if "reward/mean" not in r:
            continue
        out.append({"step": int(r["step"]), **{k: v for k, v in r.items()
                                                if k in STEP_KEYS or k.startswith(("env/", "tool/"))}})
    return out


VAL_ENV_KEYS = ("val/env/call_rate", "val/env/drift_rate", "val/env/drift_checked")
"""The held-out environment metrics kept per validation (``Trainer.validate``)."""


def validation_env(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per validation that logged a held-out call rate: its step and ``VAL_ENV_KEYS``."""
    return [{"step": int(r["step"]), **{k: r[k] for k in VAL_ENV_KEYS if r.get(k) is not None}}
            for r in rows if r.get("val/env/call_rate") is not None]


def first_last(steps: List[Dict[str, Any]], window: int) -> Dict[str, Dict[str, Optional[float]]]:
    """Each ``SUMMARY_KEYS`` metric's mean over the first and the last ``window`` steps that logged it."""
    out: Dict[str, Dict[str, Optional[float]]] = {}
    for key in SUMMARY_KEYS:
        values = [s[key] for s in steps if s.get(key) is not None]
        if values:
            w = min(window, len(values))
            out[key] = {"first": statistics.fmean(values[:w]), "last": statistics.fmean(values[-w:]),
                        "min": min(values), "max": max(values), "steps": len(values)}
    return out


def plot(task: str, steps: List[Dict[str, Any]], val: List[List[float]], path: Path,
         val_env: Optional[List[Dict[str, Any]]] = None) -> None:
    """Three panels: training reward and accuracy; the environment's behaviour (calls per trajectory and turns, and
    for code_feedback the fixed share); held-out accuracy and held-out call rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def line(ax, key, label, **kw):
        pts = [(s["step"], s[key]) for s in steps if s.get(key) is not None]
        if pts:
            ax.plot(*zip(*pts), label=label, **kw)

    fig, (ax_r, ax_e, ax_v) = plt.subplots(1, 3, figsize=(15, 4))
    line(ax_r, "reward/mean", "reward mean")
    line(ax_r, "reward/accuracy", "accuracy")
    line(ax_r, "env/reward_mean", "environment reward", linestyle="--")
    line(ax_e, "env/call_rate", "call rate (share with a well-formed call)")
    line(ax_e, "env/calls_per_trajectory", "calls per trajectory")
    line(ax_e, "env/turns_mean", "model turns per trajectory")
    if task == "code_feedback":
        line(ax_e, "env/code_feedback/first_failed", "first submission failed", linestyle="--")
        line(ax_e, "env/code_feedback/fixed", "first failed, later passed", linestyle="--")
    if val:
        ax_v.plot(*zip(*val), marker="o", label="held-out accuracy")
    held_calls = [(v["step"], v["val/env/call_rate"]) for v in val_env or []]
    if held_calls:
        ax_v.plot(*zip(*held_calls), marker="s", linestyle="--", label="held-out call rate")
    ax_r.set(title=f"{task}: training reward", xlabel="step")
    ax_e.set(title=f"{task}: environment use", xlabel="step")
    ax_v.set(title=f"{task}: held-out (greedy)", xlabel="step", ylabel="share of held-out prompts")
    for ax in (ax_r, ax_e, ax_v):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--in-process-train"]:
        return lc.train_in_process(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=TASKS, required=True)
    ap.add_argument("--algorithm", default="grpo")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--val-every", type=int, default=10, help="0: validate only before training")
    ap.add_argument("--val-size", type=int, default=32, help="held-out prompts (data.val_limit)")
    ap.add_argument("--window", type=int, default=5, help="steps averaged at the start and the end of the summary")
    ap.add_argument("--runs-dir", default=str(ROOT / "outputs" / "env_learning"))
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/env_learning_<task>.json)")
    ap.add_argument("--driver", choices=["ray", "local"], default="ray",
                    help="ray: the real command; local: the same trainer with its one worker in-process")
    ap.add_argument("--note", default="", help="free text stored in the JSON")
    ap.add_argument("--reuse", action="store_true", help="read an existing run's metrics instead of training")
    ap.add_argument("--time-limit-s", type=float, default=0.0,
                    help="stop the run if still going after this many seconds; it keeps the steps it logged")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for reasonrl.train (after --)")
    args = ap.parse_args(argv)
    args.seeds, args.parallel, args.label = [args.seed], False, ""
    overrides = [f"data.val_limit={args.val_size}", *args.overrides]
    [run] = lc.run_seeds(args.algorithm, args, overrides, name=f"{args.task}_{args.algorithm}", task=args.task,
                         script=Path(__file__).resolve())
    rows = lc.read_metrics(Path(run["run_dir"]) / "metrics.jsonl")
    steps = per_step(rows)
    val = run["curves"]["val/accuracy"]
    val_env = validation_env(rows)
    out = Path(args.out) if args.out else lc.RESULTS / f"env_learning_{args.task}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    png = out.with_suffix(".png")
    if args.reuse and out.exists():  # the wall time and the stop are the training run's, recorded when it finished
        before = json.loads(out.read_text()).get("summary", {})
        run["wall_s"], run["stopped_at_limit"] = before.get("wall_s"), before.get("stopped_at_limit", False)
    summary = {"metrics_first_last": first_last(steps, args.window), "window": args.window,
               "steps_logged": len(steps), "train_seconds": run["train_seconds"], "wall_s": run["wall_s"],
               "stopped_at_limit": run["stopped_at_limit"]}
    if len(val) >= 1:
        summary.update(lc.summarize([run], args.val_size))
    if val_env:
        summary["val_call_rate_step0"] = val_env[0]["val/env/call_rate"]
        summary["val_call_rate_final"] = val_env[-1]["val/env/call_rate"]
    result = {"benchmark": "env_learning", "task": args.task, "algorithm": args.algorithm, "seed": args.seed,
              "steps": args.steps, "val_every": args.val_every, "val_size": args.val_size, "note": args.note,
              "driver": args.driver, "command": run["command"], "overrides": overrides, "machine": lc.machine(),
              "summary": summary, "validation": val, "validation_env": val_env, "per_step": steps,
              "plot": str(png.relative_to(ROOT)) if png.is_relative_to(ROOT) else str(png)}
    plot(args.task, steps, val, png, val_env)
    out.write_text(json.dumps(result, indent=2) + "\n")
    fl = summary["metrics_first_last"]
    print(f"{args.task}: {len(steps)} steps; " + "; ".join(f"{k} {v['first']:.3f} -> {v['last']:.3f}"
                                                            for k, v in fl.items()), flush=True)
    if val:
        print(f"held-out accuracy {val[0][1]:.3f} (step {val[0][0]}) -> {val[-1][1]:.3f} (step {val[-1][0]})")
    if val_env:
        print(f"held-out call rate {val_env[0]['val/env/call_rate']:.3f} (step {val_env[0]['step']}) -> "
              f"{val_env[-1]['val/env/call_rate']:.3f} (step {val_env[-1]['step']})")
    print(f"wrote {out} and {png}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
