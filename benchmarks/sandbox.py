"""Sandbox throughput: programs/s and latency percentiles of the code verifier on each backend.

The machine is shared, so next to wall-clock throughput this records the CPU time each program costs, all of
it: this process and its children (bwrap/subprocess trees), plus for docker the containers' cgroups and the
dockerd/containerd/shim processes. ``capacity_programs_per_s`` = cores / CPU seconds per program is the rate
the backend sustains on otherwise idle cores, whatever else was running during the measurement.

One "program" is one full ``CodeVerifier.verify`` call: extraction, the harness and the program in the
sandbox, every test of the task, the verdict. Two workloads: ``trivial`` (a one-line function and three asserts:
the cost of the sandbox and harness themselves) and ``mbpp`` (the MBPP reference solutions in file order, with
all their tests; a few of them compute for seconds). Backends: ``bwrap``, ``docker`` and
``subprocess`` (plain unsandboxed child process: the ceiling). Each backend runs at several concurrency levels
(threads calling ``verify``; docker gets one warm container per thread).

    python benchmarks/sandbox.py [--programs 200] [--concurrency 1 2 4] [--out benchmarks/results/sandbox.json]
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import glob
import resource
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from reasonrl.datasets import mbpp
from reasonrl.verifiers import get_verifier

TARGETS = {"bwrap": 50.0, "docker": 40.0}
NOTES = [
    "measured_* = wall clock on this machine as it was (see loadavg_1min_before: on a shared machine other "
    "jobs take most of the CPU); capacity_* = cores / CPU seconds per program, i.e. the rate on idle cores.",
    "docker under CPU contention: every container sits in the /docker cgroup, which competes as ONE task "
    "(cpu.shares 1024) with the root cgroup's processes, so with other load the containers together get about "
    "one task's share and docker's wall rate stops growing with concurrency; bwrap processes compete one by one.",
    "benchmarks/results/sandbox_idle_2cores.json: the same script on an idle machine pinned to 2 cores "
    "(taskset -c 0,1, Ubuntu 24.04, Python 3.12, bwrap binding the host /usr; no docker there).",
    "benchmarks/results/sandbox_docker_weighted.json: docker alone with --docker-cpu-shares 8192 (the container "
    "group weighs as much as 8 host processes) on the same loaded machine.",
]


TRIVIAL = ("```python\ndef add(a, b):\n    return a + b\n```",
           {"tests": ["assert add(1, 2) == 3", "assert add(2, 5) == 7", "assert add(-1, 4) == 3"], "test_imports": []})


def workload(name: str, data_dir: Path, n: int):
    if name == "trivial":
        return [TRIVIAL] * n
    with open(data_dir / mbpp.UPSTREAM) as f:
        examples = [json.loads(line) for line in f if line.strip()]
    jobs = [(f"```python\n{ex['code']}\n```", {"tests": ex["test_list"], "test_imports": ex["test_imports"]})
            for ex in examples]
    return (jobs * (n // len(jobs) + 1))[:n]


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def docker_daemon_cpu_s() -> float:
    """CPU seconds used so far by dockerd, containerd and the shims, and by every docker container cgroup."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)
            name = fields[0].split("(", 1)[1]
            if name.startswith(("dockerd", "containerd")):
                rest = fields[1].split()
                total += (int(rest[11]) + int(rest[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    for usage in glob.glob("/sys/fs/cgroup/cpuacct/docker/*/cpuacct.usage"):
        try:
            with open(usage) as f:
                total += int(f.read()) / 1e9
        except (OSError, ValueError):
            pass
    return total


def own_cpu_s() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def measure(backend: str, jobs, concurrency: int) -> dict:
    verifier = get_verifier("code", sandbox=backend, timeout_s=20, pool_size=concurrency)
    for response, gt in jobs[:concurrency * 2]:  # warm up: docker containers start, page cache fills
        verifier.verify(response, gt)

    def one(job):
        start = time.perf_counter()
        result = verifier.verify(*job)
        return time.perf_counter() - start, result.score == 1.0

    load_before = os.getloadavg()[0]
    cpu_before = own_cpu_s() + (docker_daemon_cpu_s() if backend == "docker" else 0.0)
    start = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as ex:
        outcomes = list(ex.map(one, jobs))
    elapsed = time.perf_counter() - start
    cpu = own_cpu_s() + (docker_daemon_cpu_s() if backend == "docker" else 0.0) - cpu_before
    cores = len(os.sched_getaffinity(0))
    latencies = [t for t, _ in outcomes]
    return {
        "concurrency": concurrency,
        "programs": len(jobs),
        "seconds": round(elapsed, 3),
        "programs_per_s": round(len(jobs) / elapsed, 2),
        "p50_ms": round(1000 * statistics.median(latencies), 1),
        "p99_ms": round(1000 * percentile(latencies, 99), 1),
        "cpu_ms_per_program": round(1000 * cpu / len(jobs), 2),
        "capacity_programs_per_s": round(cores * len(jobs) / cpu, 1),
        "all_passed": all(ok for _, ok in outcomes),
        "loadavg_1min_before": round(load_before, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=200, help="programs per backend and concurrency level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--backends", nargs="+", default=["subprocess", "bwrap", "docker"])
    parser.add_argument("--workloads", nargs="+", default=["trivial", "mbpp"])
    parser.add_argument("--docker-cpu-shares", type=int, default=0,
                        help="cgroup v1: set the /docker cgroup's cpu.shares to this during the run (then restore); "
                             "1024 makes all containers together weigh as much as one host process")
    parser.add_argument("--data-dir", default=os.environ.get("REASONRL_DATA_DIR"),
                        help="folder with mbpp_sanitized.jsonl (default: $REASONRL_DATA_DIR)")
    parser.add_argument("--hold-gib", type=float, default=0.0,
                        help="first fill this many GiB of this process's memory, as a trainer holding a model does: "
                             "what starting each run costs a large caller")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "sandbox.json"))
    args = parser.parse_args()
    held = bytearray(int(args.hold_gib * 2**30))
    held[::4096] = b"\x01" * len(range(0, len(held), 4096))  # one byte written a page: every page resident
    if "mbpp" in args.workloads and not args.data_dir:
        parser.error("the mbpp workload reads mbpp_sanitized.jsonl: give --data-dir or set REASONRL_DATA_DIR")

    report = {
        "benchmark": "code verifier programs/s per sandbox backend and workload (see benchmarks/sandbox.py)",
        "machine": {"cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(), "kernel": platform.release()},
        "targets_programs_per_s": TARGETS,
        "notes": NOTES,
        "workloads": {},
        "held_gib": args.hold_gib,
    }
    shares_file = Path("/sys/fs/cgroup/cpu/docker/cpu.shares")
    old_shares = shares_file.read_text().strip() if args.docker_cpu_shares and shares_file.exists() else None
    if old_shares is not None:
        shares_file.write_text(str(args.docker_cpu_shares))
        report["docker_cgroup_cpu_shares"] = {"during_run": args.docker_cpu_shares, "before": int(old_shares)}
    try:
        for name in args.workloads:
            report["workloads"][name] = run_workload(args, workload(name, Path(args.data_dir), args.programs), name)
    finally:
        if old_shares is not None:
            shares_file.write_text(old_shares)
    from reasonrl.verifiers.code import _SANDBOXES
    for box in _SANDBOXES.values():
        box.close()
    report["loadavg_1min_after"] = round(os.getloadavg()[0], 2)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({w: {b: [v["best_measured_programs_per_s"], v["capacity_programs_per_s"]] for b, v in r.items()}
                      for w, r in report["workloads"].items()}))


def run_workload(args, jobs, name: str) -> dict:
    """Every backend at every concurrency level on one workload."""
    out = {}
    for backend in args.backends:
        runs = []
        for c in args.concurrency:
            try:
                runs.append(measure(backend, jobs, c))
            except Exception as exc:  # an unavailable backend is recorded, not fatal
                runs.append({"concurrency": c, "error": f"{type(exc).__name__}: {exc}"})
            print(name, backend, runs[-1], file=sys.stderr, flush=True)
        ok_runs = [r for r in runs if "programs_per_s" in r]
        best = max(ok_runs, key=lambda r: r["programs_per_s"], default=None)
        capacity = max((r["capacity_programs_per_s"] for r in ok_runs), default=None)
        out[backend] = {
            "runs": runs,
            "best_measured_programs_per_s": best and best["programs_per_s"],
            "best_concurrency": best and best["concurrency"],
            "capacity_programs_per_s": capacity,
            "target_programs_per_s": TARGETS.get(backend),
            "measured_meets_target": None if backend not in TARGETS or best is None
            else best["programs_per_s"] >= TARGETS[backend],
            "capacity_meets_target": None if backend not in TARGETS or capacity is None
            else capacity >= TARGETS[backend],
        }
    return out


if __name__ == "__main__":
    main()
