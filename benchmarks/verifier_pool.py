"""VerifierPool throughput vs direct in-process calls -> benchmarks/results/verifier_pool.json.

    python benchmarks/verifier_pool.py [--workers 2] [--repeats 3] [--profile]

Two workloads, both from the real data files in REASONRL_DATA_DIR (default ../shared/data):

- ``gsm8k``: every GSM8K test answer checked three ways (the full solution ending in ``#### N``,
  ``\\boxed{N}``, and a wrong ``\\boxed{N+1}``): 3,957 numeric checks;
- ``latex``: every MATH-500 answer checked against itself and against the next problem's answer inside a
  ``\\boxed{}``: 1,000 LaTeX checks, half of which reach sympy through math-verify.

``direct`` runs the verifier in ``--workers`` plain processes, each on an interleaved equal share, timed
from the parent (the ideal: no per-call IPC, no timeouts). ``pool`` is ``VerifierPool(workers=--workers)``.
Each repeat starts fresh processes in both modes (math-verify keeps LRU caches of parsed LaTeX), so every
repeat pays the parsing a training step would pay. Reported: median checks/s over the repeats, the pool's overhead
against direct, and the pool's per-call latency p50/p99 (from ``pop_stats``). The two modes alternate
repeat by repeat, so a change in the machine's load affects both alike.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import multiprocessing
import os
import platform
import pstats
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TARGETS = {"gsm8k_pool_checks_per_s": 1000.0, "latex_pool_overhead_pct": 15.0}


def gsm8k_items(data_dir: Path) -> list:
    items = []
    for line in open(data_dir / "gsm8k_test.jsonl"):
        row = json.loads(line)
        gold = row["answer"].rsplit("####", 1)[1].strip()
        value = int(gold.replace(",", ""))
        items += [("math", row["answer"], gold), ("math", f"So the total is \\boxed{{{value}}}.", gold),
                  ("math", f"So the total is \\boxed{{{value + 1}}}.", gold)]
    return items


def latex_items(data_dir: Path) -> list:
    rows = [json.loads(line) for line in open(data_dir / "math500_test.jsonl")]
    items = []
    for i, row in enumerate(rows):
        other = rows[(i + 1) % len(rows)]["answer"]
        items += [("math", f"Therefore the answer is $\\boxed{{{row['answer']}}}$.", row["answer"]),
                  ("math", f"Therefore the answer is $\\boxed{{{other}}}$.", row["answer"])]
    return items


def with_fresh_golds(items: list, repeat: int) -> list:
    """Same values, new gold strings: defeats the gold cache left by a previous repeat."""
    return [(name, response, gold + " " * (repeat + 1)) for name, response, gold in items]


# -- direct: plain processes calling the verifier in-process ----------------------------------------
def _direct_init() -> None:
    from reasonrl.verifiers.pool_worker import warm_up

    warm_up()


def _direct_shard(shard: list) -> float:
    from reasonrl.verifiers import get_verifier

    verifier = get_verifier("math")
    start = time.perf_counter()
    for _name, response, gold in shard:
        verifier.verify(response, gold)
    return time.perf_counter() - start


def run_direct(batch: list, workers: int) -> float:
    """Checks/s of ``workers`` fresh plain processes, each verifying an interleaved share in-process."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers, initializer=_direct_init) as procs:  # fresh: no warm sympy/latex caches
        procs.map(_direct_shard, [batch[:workers * 4][i::workers] for i in range(workers)])  # all started
        shards = [batch[i::workers] for i in range(workers)]  # interleaved: balanced, no per-call IPC
        start = time.perf_counter()
        procs.map(_direct_shard, shards, chunksize=1)
        return len(batch) / (time.perf_counter() - start)


# -- pool ---------------------------------------------------------------------------------------------
def run_pool(batch: list, workers: int, timeout_s: float) -> dict:
    """Checks/s and latency of a fresh ``VerifierPool(workers)`` on ``batch``."""
    from reasonrl.verifiers import VerifierPool

    with VerifierPool(workers=workers, timeout_s=timeout_s) as pool:  # fresh: no warm sympy/latex caches
        pool.verify_batch(batch[:workers * 4])  # wait until every worker is up
        pool.pop_stats()
        start = time.perf_counter()
        results = pool.verify_batch(batch)
        rate = len(batch) / (time.perf_counter() - start)
        stats = pool.pop_stats()
    assert len(results) == len(batch)
    return {"checks_per_s": rate, "latency_p50_s": stats["verify/latency_p50_s"],
            "latency_p99_s": stats["verify/latency_p99_s"], "timeouts": stats["verify/timeouts"]}


def profile_direct(items: list, top: int = 12) -> str:
    """cProfile of the in-process verifier on ``items``: where the time of one check goes."""
    from reasonrl.verifiers import get_verifier

    verifier = get_verifier("math")
    profiler = cProfile.Profile()
    profiler.enable()
    for _name, response, gold in with_fresh_golds(items, 99):
        verifier.verify(response, gold)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=10.0)
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("REASONRL_DATA_DIR", DEFAULT_DATA)))
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the direct LaTeX checks")
    parser.add_argument("--out", type=Path, default=RESULTS / "verifier_pool.json")
    args = parser.parse_args()

    report = {"workers": args.workers, "repeats": args.repeats, "timeout_s": args.timeout_s,
              "machine": {"cpu_count": os.cpu_count(), "load_avg_1m_at_start": os.getloadavg()[0],
                          "python": platform.python_version(), "platform": platform.platform()},
              "targets": TARGETS}
    for name, items in (("gsm8k", gsm8k_items(args.data_dir)), ("latex", latex_items(args.data_dir))):
        print(f"{name}: {len(items)} checks x {args.repeats} repeats, {args.workers} processes", flush=True)
        directs, pools = [], []
        for repeat in range(args.repeats):  # alternate the modes so that load drift hits both alike
            directs.append(run_direct(with_fresh_golds(items, repeat), args.workers))
            pools.append(run_pool(with_fresh_golds(items, repeat), args.workers, args.timeout_s))
        direct = {"checks_per_s": statistics.median(directs), "checks_per_s_each_repeat": directs}
        pool = {"checks_per_s": statistics.median(p["checks_per_s"] for p in pools),
                "checks_per_s_each_repeat": [p["checks_per_s"] for p in pools],
                "latency_p50_s": statistics.median(p["latency_p50_s"] for p in pools),
                "latency_p99_s": statistics.median(p["latency_p99_s"] for p in pools),
                "timeouts": sum(p["timeouts"] for p in pools)}
        overhead = 100.0 * (1.0 - pool["checks_per_s"] / direct["checks_per_s"])
        report[name] = {"checks": len(items), "direct": direct, "pool": pool, "pool_overhead_pct": overhead}
        print(f"  direct {direct['checks_per_s']:.0f}/s  pool {pool['checks_per_s']:.0f}/s  "
              f"overhead {overhead:.1f}%  p99 {pool['latency_p99_s'] * 1000:.1f} ms", flush=True)
        if args.profile and name == "latex":
            print(profile_direct(items[:200]))
    report["machine"]["load_avg_1m_at_end"] = os.getloadavg()[0]
    report["met"] = {
        "gsm8k_pool_checks_per_s": report["gsm8k"]["pool"]["checks_per_s"] >= TARGETS["gsm8k_pool_checks_per_s"],
        "latex_pool_overhead_pct": report["latex"]["pool_overhead_pct"] <= TARGETS["latex_pool_overhead_pct"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
