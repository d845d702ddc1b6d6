"""Environment steps per second for each shipped environment (``reasonrl/envs``), stepped directly and through the
loop's concurrent step runner (``reasonrl.envs.steps.run_jobs``, one thread per trajectory) at several concurrency
levels.

Workloads: ``search`` (one FTS5 query per step, the question of a test row as the query), ``python`` (a one-line
cell in the sandbox: ``print(sum(range(1000)))``, a fresh session per step, so each step is one sandbox run),
``code_feedback`` (a three-test submission run by the code verifier's harness in the sandbox). The machine is
shared: next to wall-clock rates this records the CPU seconds per step (this process and its children) and the
load average before each measurement, so ``capacity_steps_per_s`` = cores / CPU seconds per step is the rate on
idle cores.

    python benchmarks/env_steps.py [--steps 40] [--concurrency 1 4] [--out benchmarks/results/env_steps.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

from reasonrl.config.schema import ToolConfig
from reasonrl.datasets import search as search_data
from reasonrl.envs import EnvContext, ToolCall, make_environment
from reasonrl.envs.steps import run_jobs

ADD = {"reward_model": {"ground_truth": {"tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 4",
                                                   "assert add(0, 5) == 5"]}}}


def cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def workload(name: str, context: EnvContext, steps: int):
    """``steps`` (row, call) pairs for environment ``name``."""
    if name == "search":
        rows = search_data.build_rows("test")[:steps]
        return [(r, ToolCall("search", {"query": r["prompt"][-1]["content"]})) for r in rows]
    if name == "python":
        return [({}, ToolCall("python", {"code": "print(sum(range(1000)))"}))] * steps
    return [(ADD, ToolCall("python", {"code": "def add(a, b):\n    return a + b"}))] * steps


def one_step(name: str, context: EnvContext, row, call):
    env = make_environment(name, context)
    try:
        env.reset(row)
        result = env.step(call)
        assert not result.error, result.observation
        return result
    finally:
        env.close()


def measure(name: str, context: EnvContext, steps: int, concurrency: int) -> dict:
    work = workload(name, context, steps)
    one_step(name, context, *work[0])  # warm: the index, the sandbox backend
    load = os.getloadavg()[0]
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    outcomes = run_jobs([lambda r=r, c=c: one_step(name, context, r, c) for r, c in work], [120.0] * len(work),
                        concurrency)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    failed = [why for _, why in outcomes if why is not None]
    cores = os.cpu_count() or 1
    return {"environment": name, "concurrency": concurrency, "steps": len(work), "failed": len(failed),
            "measured_steps_per_s": round(len(work) / wall, 2), "cpu_s_per_step": round(cpu / len(work), 5),
            "capacity_steps_per_s": round(cores * len(work) / max(cpu, 1e-9), 2),
            "loadavg_1min_before": round(load, 2), "first_failure": failed[0] if failed else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--environments", nargs="+", default=["search", "python", "code_feedback"])
    ap.add_argument("--out", default="benchmarks/results/env_steps.json")
    args = ap.parse_args(argv)
    context = EnvContext(ToolConfig(sandbox="auto", timeout_s=5.0, memory_mb=256))
    results = []
    try:
        for name in args.environments:
            for c in args.concurrency:
                results.append(measure(name, context, args.steps, c))
                print(json.dumps(results[-1]), flush=True)
    finally:
        context.close()
    out = {"benchmark": "env_steps", "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                                 "python": sys.version.split()[0]},
           "notes": ["one step = a fresh environment, reset, one tool call, close (python: a fresh session, so a "
                     "sandbox run per step)", "measured_* = wall clock on the shared machine as it was; "
                     "capacity_* = cores / CPU seconds per step (this process and its children)"],
           "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
