"""Does the pass-rate curriculum learn faster? ``data.sampler=uniform`` vs ``pass_rate`` at equal rollouts.

    python benchmarks/curriculum.py --seeds 1 2 --steps 40 --val-every 5 --val-size 100 --parallel \\
        -- rollout.engine=hf data.train_batch_size=32 rollout.n=8 actor.lr=1e-5
    python benchmarks/curriculum.py --shape tiny --out /tmp/curriculum.json    # plumbing only, minutes on a CPU

Task ``arith_levels`` (datasets/arith_levels.py: easy, medium and hard problems mixed in the training rows, 100
held-out problems per level), ``--task arith_chain`` (datasets/arith_chain.py: sums and differences of 3 to 8
two-digit numbers, levels l1 .. l5) or ``--task countdown`` the graded countdown puzzles (datasets/countdown.py:
levels l1 .. l5, docs/tasks.md). Every sampler x seed trains with the same algorithm, batch and steps, so each step
costs the same rollouts (train_batch_size x rollout.n responses; no dynamic sampling); only the prompts drawn differ.
The runs go through benchmarks/learning_curve.py's machinery (``--driver local``: the trainer in-process with one
worker; ``--parallel``: the seeds at once, and the samplers at once beside them; ``--time-limit-s``) and read the
trainer's mix metrics (``reasonrl/trainer/metrics.py``, logged when the data has two or more levels):

* per round: ``levels/responses`` (rollouts), ``levels/informative_groups`` (share of the round's groups whose
  rewards are not all equal: the ones with a non-zero group-relative advantage, as DAPO's filter counts them,
  ``informative_group_ids``), ``levels/share/<level>`` and ``levels/train_accuracy/<level>``;
* per validation: ``val/<level>/accuracy`` (greedy, over the level's held-out problems).

The trainer's own ``curriculum/*`` metrics (reasonrl/data/curriculum.py, e.g. ``curriculum/batch_informativeness``,
the batch's mean estimated p(1 - p)) are logged as well and kept in the JSON.

Output: ``benchmarks/results/curriculum.json`` and ``.png`` (held-out accuracy per level and the informative-group
fraction against rollouts, one line per sampler x seed). The summary compares the samplers at the last validation
step every run reached (equal rollouts): accuracy per level, mean over seeds, the difference pass_rate - uniform,
and its noise yardstick, twice the larger of the seeds' std and the binomial SE of a difference on the level's
held-out problems; and, per level, each run's first validation step at ``--target-accuracy`` (steps to a fixed
accuracy: ``summary.steps_to_target``). A run whose training fails (e.g. out of GPU memory beside the others) is
kept in the JSON's runs with its ``failed`` record and left out of the summary (``summary.failed_runs``; exit
status 1 after the JSON is written), so the runs that finished keep their figures.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import learning_curve as lc  # noqa: E402  (benchmarks/ is not a package)

ROOT = lc.ROOT
TASK = "arith_levels"
LEVELS = ("easy", "medium", "hard")
"""The task trained on and its levels (``--task`` sets both: the levels are its recipe's ``LEVELS``)."""
TINY = ["data.train_batch_size=3", "rollout.n=2", "rollout.max_new_tokens=16", "actor.ppo_mini_batch_size=3",
        "data.val_batch_size=6"]
"""``--shape tiny``'s training overrides (before the user's, which win): a CPU dry run of the plumbing."""


def run_curves(rows: List[Dict[str, Any]]) -> Dict[str, List[List[float]]]:
    """``[rollouts, value]`` pairs per metric of one run (rollouts: responses generated before the value was
    logged; a validation at step k comes after step k's rollouts)."""
    out: Dict[str, List[List[float]]] = {}
    rollouts = 0.0
    keys = ("val/accuracy", *(f"val/{lv}/accuracy" for lv in LEVELS), "levels/informative_groups",
            "curriculum/batch_informativeness", *(f"levels/share/{lv}" for lv in LEVELS),
            *(f"levels/train_accuracy/{lv}" for lv in LEVELS), "reward/mean")
    for r in sorted(rows, key=lambda r: int(r["step"])):
        rollouts += float(r.get("levels/responses", 0.0))
        for key in keys:
            if r.get(key) is not None:
                out.setdefault(key, []).append([int(r["step"]), rollouts, float(r[key])])
    return out


def _mean_std(xs: List[float]) -> Dict[str, Any]:
    return {"mean": statistics.fmean(xs) if xs else float("nan"), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
            "values": xs}


def _at_step(curve: List[List[float]], step: int) -> Optional[float]:
    return next((v for s, _, v in curve if s == step), None)


def finished_runs(runs: Dict[str, List[Dict[str, Any]]]) -> Tuple[Dict[str, List[Dict[str, Any]]],
                                                                    Dict[str, List[int]]]:
    """(the runs to compare: each sampler's runs that did not fail, samplers with none left out; each sampler's
    failed seeds). A run that crashed holds only the steps before its crash, so it would pull the compared step
    back to them."""
    kept = {name: [r for r in rs if not r.get("failed")] for name, rs in runs.items()}
    failed = {name: [r["seed"] for r in rs if r.get("failed")] for name, rs in runs.items()}
    return {name: rs for name, rs in kept.items() if rs}, failed


def summarize(runs: Dict[str, List[Dict[str, Any]]], val_per_level: int) -> Dict[str, Any]:
    """The samplers at the last validation step every run reached (equal rollouts), per level, with the noise
    yardstick (module docstring); the informative-group fraction averaged over the steps up to it."""
    val_steps = [{s for s, _, _ in r["curves"].get("val/accuracy", [])} for rs in runs.values() for r in rs]
    common = max(set.intersection(*val_steps)) if val_steps and set.intersection(*val_steps) else None
    out: Dict[str, Any] = {"compared_at_step": common, "val_prompts_per_level": val_per_level, "levels": {}}
    if common is None:
        return out
    out["rollouts_at_step"] = {name: [next(x for s, x, _ in r["curves"]["val/accuracy"] if s == common) for r in rs]
                               for name, rs in runs.items()}
    for level in ("all", *LEVELS):
        key = "val/accuracy" if level == "all" else f"val/{level}/accuracy"
        per: Dict[str, Any] = {}
        for name, rs in runs.items():
            start = [_at_step(r["curves"].get(key, []), 0) for r in rs]
            end = [_at_step(r["curves"].get(key, []), common) for r in rs]
            area = [statistics.fmean([v for s, _, v in r["curves"].get(key, []) if s <= common] or [float("nan")])
                    for r in rs]
            per[name] = {"step0": _mean_std([x for x in start if x is not None]),
                         "at_common_step": _mean_std([x for x in end if x is not None]),
                         "mean_over_validations": _mean_std(area)}
        if "uniform" in per and "pass_rate" in per:
            u, p = per["uniform"]["at_common_step"], per["pass_rate"]["at_common_step"]
            n = val_per_level * (len(LEVELS) if level == "all" else 1)
            se = math.sqrt(max(u["mean"] * (1 - u["mean"]), 0) / n + max(p["mean"] * (1 - p["mean"]), 0) / n)
            yardstick = 2 * max(se, u["std"], p["std"])
            diff = p["mean"] - u["mean"]
            per["pass_rate_minus_uniform"] = {"difference": diff, "binomial_se": se, "noise_yardstick": yardstick,
                                              "beyond_noise": bool(abs(diff) > yardstick)}
        out["levels"][level] = per
    out["informative_groups"] = {
        name: _mean_std([statistics.fmean([v for s, _, v in r["curves"].get("levels/informative_groups", [])
                                           if s <= common] or [float("nan")]) for r in rs])
        for name, rs in runs.items()}
    return out


def steps_to_target(runs: Dict[str, List[Dict[str, Any]]], target: float, last_step: Optional[int]) -> Dict[str, Any]:
    """Per level and sampler, each run's first validation step (up to ``last_step``, the step every run reached) at
    which held-out accuracy is at least ``target`` (None: not by then); the mean and std over the runs that reached
    it, and how many did."""
    out: Dict[str, Any] = {"target": target, "up_to_step": last_step, "levels": {}}
    if last_step is None:
        return out
    for level in ("all", *LEVELS):
        key = "val/accuracy" if level == "all" else f"val/{level}/accuracy"
        per: Dict[str, Any] = {}
        for name, rs in runs.items():
            steps = [next((int(s) for s, _, v in sorted(r["curves"].get(key, [])) if s <= last_step and v >= target),
                          None) for r in rs]
            reached = [s for s in steps if s is not None]
            per[name] = {"steps": steps, "reached": len(reached), "runs": len(steps),
                         **({"mean": statistics.fmean(reached),
                             "std": statistics.stdev(reached) if len(reached) > 1 else 0.0} if reached else {})}
        out["levels"][level] = per
    return out


def plot(runs: Dict[str, List[Dict[str, Any]]], path: Path) -> None:
    """One panel per level (held-out accuracy vs rollouts) and one of the informative-group fraction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(f"val/{lv}/accuracy", f"held-out accuracy: {lv}") for lv in LEVELS]
    panels.append(("levels/informative_groups", "informative groups (share of the batch)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8))
    colors = {"uniform": "tab:blue", "pass_rate": "tab:orange"}
    for ax, (key, title) in zip(axes, panels):
        for name, rs in runs.items():
            for r, style in zip(rs, ("-", "--", ":", "-.")):
                curve = r["curves"].get(key, [])
                if curve:
                    ax.plot([x for _, x, _ in curve], [v for _, _, v in curve], style, color=colors.get(name),
                            marker="o", ms=3 if key.startswith("val/") else 1.5, label=f"{name} seed {r['seed']}")
        ax.set(title=title, xlabel="rollouts (responses generated)", ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default=TASK, choices=["arith_levels", "arith_chain", "countdown"],
                        help="a generated task with levels (docs/tasks.md)")
    parser.add_argument("--algorithm", default="grpo", help="the algorithm preset both samplers train with")
    parser.add_argument("--samplers", nargs="+", default=["uniform", "pass_rate"], choices=["uniform", "pass_rate"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--val-every", type=int, default=5)
    parser.add_argument("--val-size", type=int, default=100, help="held-out prompts per level (at most 100)")
    parser.add_argument("--shape", choices=["full", "tiny"], default="full",
                        help="tiny: 2 steps, 2 held-out prompts per level, 3 x 2 rollouts (a CPU dry run)")
    parser.add_argument("--runs-dir", default=str(ROOT / "outputs" / "curriculum"))
    parser.add_argument("--out", default=str(lc.RESULTS / "curriculum.json"))
    parser.add_argument("--driver", choices=["local"], default="local",
                        help="local: the trainer in-process with one worker (the level metrics are installed there)")
    parser.add_argument("--target-accuracy", type=float, default=0.2,
                        help="the held-out accuracy whose first validation step per level the summary reports")
    parser.add_argument("--note", default="", help="free text stored in the JSON")
    parser.add_argument("--reuse", action="store_true", help="read existing runs' metrics instead of training")
    parser.add_argument("--parallel", action="store_true", help="train every sampler x seed at the same time")
    parser.add_argument("--time-limit-s", type=float, default=0.0,
                        help="stop runs still going after this many seconds; they keep the steps they logged")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for reasonrl.train (after --)")
    args = parser.parse_args(argv)
    if not 1 <= args.val_size <= 100:
        parser.error(f"--val-size must be in [1, 100] (the held-out problems per level), got {args.val_size}")
    if args.shape == "tiny":
        args.steps, args.val_every, args.val_size = 2, 1, 2
        args.overrides = [*TINY, *args.overrides]
    return args


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--in-process-train"]:
        return lc.train_in_process(argv[1:])
    args = parse_args(argv)
    from reasonrl.datasets import prepare
    from reasonrl.datasets.common import recipe

    global TASK, LEVELS
    TASK, LEVELS = args.task, tuple(level.name for level in recipe(args.task).LEVELS)

    data = Path(args.runs_dir) / "data"
    train_file, val_file = prepare(TASK, "train", out_dir=data), prepare(TASK, "test", out_dir=data)
    # test is round-robin over the levels: its first 3 x val_size rows hold val_size problems of each level
    overrides = [f"data.train_files=[{train_file}]", f"data.val_files=[{val_file}]",
                 f"data.val_limit={len(LEVELS) * args.val_size}", *args.overrides]
    with ThreadPoolExecutor(max_workers=len(args.samplers) if args.parallel else 1) as pool:
        futures = {name: pool.submit(lc.run_seeds, args.algorithm, args, [*overrides, f"data.sampler={name}"],
                                     name, TASK, Path(__file__).resolve(), keep_failed=True)
                   for name in args.samplers}
        runs = {name: f.result() for name, f in futures.items()}
    for rs in runs.values():
        for r in rs:
            r["curves"] = run_curves(lc.read_metrics(Path(r["run_dir"]) / "metrics.jsonl"))
    compared, failed = finished_runs(runs)
    if not compared:
        raise RuntimeError(f"every run failed: {failed}; their logs are under {args.runs_dir}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    png = out.with_suffix(".png")
    summary = summarize(compared, args.val_size)
    summary["steps_to_target"] = steps_to_target(compared, args.target_accuracy, summary["compared_at_step"])
    summary["failed_runs"] = failed
    result = {"benchmark": "curriculum", "task": TASK, "algorithm": args.algorithm, "samplers": args.samplers,
              "seeds": args.seeds, "steps": args.steps, "val_every": args.val_every, "shape": args.shape,
              "time_limit_s": args.time_limit_s, "note": args.note, "driver": args.driver, "overrides": overrides,
              "machine": lc.machine(), "summary": summary, "runs": runs,
              "plot": str(png.relative_to(ROOT)) if png.is_relative_to(ROOT) else str(png)}
    plot(runs, png)
    out.write_text(json.dumps(result, indent=2))
    print(f"compared at step {summary['compared_at_step']}:", flush=True)
    for level, per in summary["levels"].items():
        line = ", ".join(f"{name} {per[name]['at_common_step']['mean']:.3f}" for name in args.samplers if name in per)
        diff = per.get("pass_rate_minus_uniform")
        extra = (f"; difference {diff['difference']:+.3f} (yardstick {diff['noise_yardstick']:.3f}, beyond noise: "
                 f"{diff['beyond_noise']})") if diff else ""
        print(f"  {level}: {line}{extra}", flush=True)
    reach = summary["steps_to_target"]
    for level, per in reach["levels"].items():
        print(f"  first step at {reach['target']:.2f} on {level}: " + ", ".join(
            f"{name} {per[name]['steps']}" for name in args.samplers if name in per), flush=True)
    print("informative groups: " + ", ".join(f"{k} {v['mean']:.3f}" for k, v in
                                             summary.get("informative_groups", {}).items()) + f"; wrote {out}, {png}")
    if any(failed.values()):
        print(f"failed runs, left out of the summary (kept in the JSON's runs): {failed}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
