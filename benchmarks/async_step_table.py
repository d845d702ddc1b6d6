"""The table of one lease's ``gpu_async_step.py`` runs: for each run (one JSON, one mode), the timed steps' wall
seconds (median, min-max, mean), trained tokens/s (median, min-max) and pooled (all trained tokens over all step
seconds), and both ratios over the baseline run -> markdown on stdout, and the figures as JSON (``--out``).

    python benchmarks/async_step_table.py colocated=benchmarks/results/s27_async_colocated.json \\
        nopartial=benchmarks/results/s27_async_nopartial.json \\
        in_engine=benchmarks/results/s27_async_partial_in_engine.json

The first run is the baseline (``--baseline LABEL`` picks another). The pooled ratio is the one to read when steps
alternate between long and short (as the in-engine line of the twenty-seventh session's did), where a median falls
between two clusters. Runs from different machines are refused: a figure from two machines is not a ratio.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reasonrl.bench.async_step import summarize  # noqa: E402


def run_summary(result: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    """A ``gpu_async_step.py`` JSON of one mode -> (its mode, ``summarize`` of its timed steps)."""
    modes = result.get("modes") or {}
    if len(modes) != 1:
        raise ValueError(f"a run of one mode expected, got modes {sorted(modes)}")
    (mode, record), = modes.items()
    if not record.get("steps"):
        raise ValueError(f"the {mode} run has no timed steps")
    warm = record.get("warmup_steps") or []
    return mode, summarize(record["steps"], warm[-1] if warm else None)


def table(runs: Dict[str, Dict[str, Any]], baseline: str) -> List[Dict[str, Any]]:
    """One row per run (label -> ``summarize`` output), with its ratios over ``runs[baseline]``."""
    base = runs[baseline]
    rows = []
    for label, s in runs.items():
        rows.append({"label": label, "steps": s["steps"], "wall_s": s["wall_s"], "wall_s_mean": s["wall_s_mean"],
                     "trained_tokens_per_s": s["trained_tokens_per_s"],
                     "trained_tokens_per_s_pooled": s["trained_tokens_per_s_pooled"],
                     "over_baseline_medians": s["trained_tokens_per_s"]["median"]
                     / base["trained_tokens_per_s"]["median"],
                     "over_baseline_pooled": s["trained_tokens_per_s_pooled"] / base["trained_tokens_per_s_pooled"]})
    return rows


def markdown(rows: List[Dict[str, Any]]) -> str:
    out = ["| run | timed steps | step wall s, median (min-max) | mean | trained tokens/s, median (min-max) | pooled "
           "| over baseline: medians, pooled |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        w, t = r["wall_s"], r["trained_tokens_per_s"]
        out.append(f"| {r['label']} | {r['steps']} | {w['median']:.2f} ({w['min']:.2f}-{w['max']:.2f}) | "
                   f"{r['wall_s_mean']:.2f} | {t['median']:,.0f} ({t['min']:,.0f}-{t['max']:,.0f}) | "
                   f"{r['trained_tokens_per_s_pooled']:,.0f} | {r['over_baseline_medians']:.2f}, "
                   f"{r['over_baseline_pooled']:.2f} |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", metavar="LABEL=PATH")
    p.add_argument("--baseline", default="", help="the baseline run's label (default: the first)")
    p.add_argument("--out", type=Path, default=None, help="the table as JSON")
    args = p.parse_args()
    runs: Dict[str, Dict[str, Any]] = {}
    machines = set()
    for item in args.runs:
        label, _, path = item.partition("=")
        if not path:
            p.error(f"{item!r}: LABEL=PATH expected")
        result = json.loads(Path(path).read_text())
        machines.add(json.dumps(result.get("machine"), sort_keys=True))
        runs[label] = run_summary(result)[1]
    if len(machines) > 1:
        p.error("the runs come from different machines (their 'machine' records differ): not one ratio")
    baseline = args.baseline or next(iter(runs))
    if baseline not in runs:
        p.error(f"--baseline {baseline!r} is not one of {sorted(runs)}")
    rows = table(runs, baseline)
    print(markdown(rows))
    if args.out:
        args.out.write_text(json.dumps({"baseline": baseline, "runs": dict(zip(runs, args.runs)), "rows": rows},
                                       indent=1) + "\n")


if __name__ == "__main__":
    main()
