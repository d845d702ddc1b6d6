"""Learning parity: do the speed-ups and the async mode learn what the plain colocated loop learns?

    python benchmarks/learning_parity.py --seeds 1 2 --steps 20 --val-every 5 --val-size 300

Trains ``arith`` (real SmolLM2, hf engine, same seeds and data) once per variant with
``benchmarks/learning_curve.py`` (one run directory and one JSON per variant under ``--runs-dir`` and
``results/learning_parity/``), then compares each variant's held-out accuracy with the baseline's at every
validation step. The variants:

- ``colocated``: the default loop (baseline);
- ``packing``: padding-free micro-batches and token-budget micro-batches for the actor and the reference
  (``actor.use_packing=true``, ``actor.max_tokens_per_micro_batch``, ``ref.max_tokens_per_micro_batch``);
- ``async``: ``trainer.mode=async`` with one rollout worker one step ahead (truncated importance sampling on);
- ``fleet_k<k>`` and ``fleet_k<k>_partial`` (issue #48): one fleet replica generating continuously
  (``fleet.continuous``), admission bounding the lag at ``async_rollout.max_staleness=k`` (k = 0, 1, 2, 4), without
  and with partial rollouts (``rollout.partial``, segments of 16 tokens);
- ``fleet_k<k>_in_engine`` (k = 1, 2): partial rollouts kept inside vLLM (``rollout.partial_mode=in_engine``; needs
  ``rollout.engine=vllm``), the weights loaded between two of its steps.

At each validation step the difference of the seed-mean accuracies is "within noise" when it is at most twice the
larger of (a) the binomial standard error of a difference of two accuracies on the held-out prompts and (b) the
standard deviation over seeds of either variant. Writes ``results/learning_parity.json``.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Optional

import learning_curve  # noqa: E402  (the sibling script: one seed runner for every benchmark)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

VARIANTS: Dict[str, List[str]] = {
    "colocated": [],
    "packing": ["actor.use_packing=true", "actor.max_tokens_per_micro_batch=2048", "ref.max_tokens_per_micro_batch=2048"],
    "async": ["trainer.mode=async", "async_rollout.num_rollout_workers=1", "async_rollout.max_staleness=1"],
    **{f"fleet_k{k}{'_partial' if partial else ''}":
       ["trainer.mode=async", "async_rollout.num_rollout_workers=1", "fleet.enabled=true", "fleet.continuous=true",
        f"async_rollout.max_staleness={k}", *(["rollout.partial=true", "rollout.partial_segment_tokens=16"]
                                               if partial else [])]
       for k in (0, 1, 2, 4) for partial in (False, True) if k or not partial},
    **{f"fleet_k{k}_in_engine":
       ["trainer.mode=async", "async_rollout.num_rollout_workers=1", "fleet.enabled=true", "fleet.continuous=true",
        f"async_rollout.max_staleness={k}", "rollout.partial=true", "rollout.partial_mode=in_engine"]
       for k in (1, 2)},
}
ON_RAY = {name for name, keys in VARIANTS.items() if "trainer.mode=async" in keys}
"""The variants that need the Ray backend (their rollout workers are Ray actors)."""


def val_by_step(result: Dict) -> Dict[int, List[float]]:
    """Held-out accuracy per validation step, one value per seed (seeds that reached the step)."""
    table: Dict[int, List[float]] = {}
    for run in result["runs"]:
        for step, acc in run["curves"]["val/accuracy"]:
            table.setdefault(int(step), []).append(acc)
    return table


def compare(base: Dict, other: Dict, val_size: int) -> List[Dict]:
    """One row per validation step both reached: the two seed means, their difference and the noise yardstick."""
    a, b = val_by_step(base), val_by_step(other)
    rows = []
    for step in sorted(set(a) & set(b)):
        pa, pb = statistics.fmean(a[step]), statistics.fmean(b[step])
        binom = math.sqrt(pa * (1 - pa) / val_size + pb * (1 - pb) / val_size)
        seed_std = max((statistics.stdev(x) if len(x) > 1 else 0.0) for x in (a[step], b[step]))
        noise = max(binom, seed_std)
        rows.append({"step": step, "baseline": pa, "variant": pb, "difference": pb - pa,
                     "noise": noise, "within_noise": abs(pb - pa) <= 2 * noise})
    return rows


def read_saved(name: str, args: argparse.Namespace, overrides: List[str]) -> Dict:
    """An earlier invocation's results for one variant, refused unless it ran what this invocation would run."""
    path = Path(args.saved_dir or RESULTS / Path(args.out).stem) / f"{name}.json"
    if not path.exists():
        raise SystemExit(f"--saved {name}: {path} does not exist (train it first)")
    saved = json.loads(path.read_text())
    ran = [o for o in saved["overrides"] if not o.startswith(("data.train_files=", "data.val_files="))]
    wanted = {"seeds": args.seeds, "steps": args.steps, "val_every": args.val_every,
              "overrides": [f"data.val_limit={args.val_size}", *overrides]}
    found = {"seeds": saved["seeds"], "steps": saved["steps"], "val_every": saved["val_every"], "overrides": ran}
    for key in wanted:
        if wanted[key] != found[key]:
            raise SystemExit(f"--saved {name}: {path} ran {key}={found[key]}, this invocation asks for {wanted[key]}")
    return saved


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--val-every", type=int, default=5)
    parser.add_argument("--val-size", type=int, default=300)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--runs-dir", default=str(ROOT / "outputs" / "learning_parity"))
    parser.add_argument("--reuse", action="store_true", help="read existing runs instead of training")
    parser.add_argument("--saved", nargs="*", default=[], choices=list(VARIANTS),
                        help="variants read from their results/learning_parity/<name>.json of an earlier invocation "
                             "(same seeds, steps and overrides; checked) instead of trained now")
    parser.add_argument("--saved-dir", default=None,
                        help="the folder --saved reads from (default: results/<the stem of --out>/)")
    parser.add_argument("--driver", choices=["ray", "local"], default="ray",
                        help="learning_curve.py's driver for the colocated variants (async always runs on Ray)")
    parser.add_argument("--out", default=str(RESULTS / "learning_parity.json"),
                        help="the comparison's JSON; each variant's runs go to results/<its stem>/<variant>.json")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every variant (after --)")
    args = parser.parse_args(argv)

    common = ["rollout.engine=hf", "data.train_batch_size=32", "rollout.n=8", "rollout.temperature=0.7",
              "actor.lr=1e-5", "actor.ppo_mini_batch_size=8", "actor.micro_batch_size_per_worker=64",
              f"data.val_batch_size={args.val_size}", "reward.workers=2", "algorithm.use_kl_loss=false",
              *args.overrides]
    results = {name: read_saved(name, args, [*common, *VARIANTS[name]]) for name in args.saved}
    for name in args.variants:
        if name in results:
            continue
        out = RESULTS / Path(args.out).stem / f"{name}.json"  # beside the comparison, in a folder of its name
        cli = ["--algorithm", "grpo", "--seeds", *map(str, args.seeds), "--steps", str(args.steps),
               "--val-every", str(args.val_every), "--val-size", str(args.val_size),
               "--runs-dir", str(Path(args.runs_dir) / name), "--out", str(out), "--note", f"learning parity: {name}",
               "--driver", "ray" if name in ON_RAY else args.driver]
        if args.reuse:
            cli.append("--reuse")
        if learning_curve.main([*cli, "--", *common, *VARIANTS[name]]) != 0:
            raise RuntimeError(f"variant {name} failed")
        results[name] = json.loads(out.read_text())
    base = results.get("colocated")
    report = {"benchmark": "learning_parity", "task": "arith", "algorithm": "grpo", "seeds": args.seeds,
              "steps": args.steps, "val_size": args.val_size, "common_overrides": common,
              "variants": {n: VARIANTS[n] for n in results}, "read_from_earlier_runs": args.saved,
              "machine": learning_curve.machine(),
              "train_seconds": {n: [r["train_seconds"] for r in res["runs"]] for n, res in results.items()},
              "comparisons": {}}
    if base is not None:
        for name, res in results.items():
            if name != "colocated":
                rows = compare(base, res, args.val_size)
                report["comparisons"][name] = {"rows": rows, "all_within_noise": all(r["within_noise"] for r in rows)}
    out = Path(args.out)
    out.write_text(json.dumps(report, indent=2))
    for name, cmp in report["comparisons"].items():
        diffs = ", ".join(f"{r['step']}: {r['difference']:+.3f}" for r in cmp["rows"])
        print(f"{name} vs colocated (held-out accuracy difference per step) {diffs}; "
              f"within noise: {cmp['all_within_noise']}", flush=True)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
