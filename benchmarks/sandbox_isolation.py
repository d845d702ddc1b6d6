"""What the per-run isolation costs: one sandbox run of ``/bin/true`` with it and without it, on each backend.

"With" is the code as it is. "Without" takes back only what isolates runs from each other and sizes every tmpfs:

* bwrap: no ``--seccomp`` filter, no size-limited ``/dev/shm`` tmpfs, no ``--remount-ro /dev``;
* docker: the dispatcher skips the reset after each job (removing System V objects, emptying ``/dev/shm`` and
  ``/dev/mqueue``, checking they are empty).

The two variants run in alternating blocks (the machine is shared: alternation spreads its load over both), and
each run's wall-clock time is measured around ``Sandbox.run``; for bwrap also the CPU time of this process and
its children. Medians and the difference go to JSON.

    python benchmarks/sandbox_isolation.py [--runs 200] [--block 20] [--out benchmarks/results/sandbox_isolation.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import time
from pathlib import Path

from reasonrl.sandboxes import Limits, get_sandbox
from reasonrl.sandboxes import docker_pool
from reasonrl.sandboxes.bwrap import BwrapSandbox

COMMAND = ["/bin/true"]
LIMITS = Limits(timeout_s=10)


class BwrapWithoutIsolation(BwrapSandbox):
    """The bwrap backend less its seccomp filter, its /dev/shm tmpfs and its read-only /dev (benchmark only)."""

    def _bwrap_args(self, limits, file_fds, work_bind, seccomp_fd):
        args = super()._bwrap_args(limits, file_fds, work_bind, None)
        i = args.index("/dev/shm")  # --size N --perms 01777 --tmpfs /dev/shm --remount-ro /dev
        return args[:i - 5] + args[i + 3:]


def dispatcher_without_reset(source: str) -> str:
    """The dispatcher's source with its after-job reset turned into no-ops."""
    patched = source.replace("def remove_sysv_objects():",
                             "def remove_sysv_objects():\n    return\n\n\ndef _unused_a():")
    patched = patched.replace("def clear_ipc():", "def clear_ipc():\n    return True\n\n\ndef _unused_b():")
    if patched.count("_unused_") != 2:
        raise SystemExit("sandboxes/dispatcher.py changed: update dispatcher_without_reset")
    return patched


def cpu_s() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed_runs(box, n: int):
    walls, cpus = [], []
    for _ in range(n):
        c0, t0 = cpu_s(), time.perf_counter()
        res = box.run({}, COMMAND, LIMITS)
        walls.append(time.perf_counter() - t0)
        cpus.append(cpu_s() - c0)
        if res.exit_code != 0:
            raise SystemExit(f"{box.name}: /bin/true exited {res.exit_code}: {res.stderr[:300]}")
    return walls, cpus


def compare(with_box, without_box, runs: int, block: int) -> dict:
    samples = {"with": ([], []), "without": ([], [])}
    for box in (with_box, without_box):  # warm up: page cache, docker container start
        timed_runs(box, 5)
    for _ in range(max(1, runs // block)):
        for key, box in (("with", with_box), ("without", without_box)):
            walls, cpus = timed_runs(box, block)
            samples[key][0].extend(walls)
            samples[key][1].extend(cpus)
    out = {}
    for key, (walls, cpus) in samples.items():
        out[key] = {"runs": len(walls), "median_wall_ms": round(1000 * statistics.median(walls), 3),
                    "median_cpu_ms": round(1000 * statistics.median(cpus), 3)}
    out["added_median_wall_ms"] = round(out["with"]["median_wall_ms"] - out["without"]["median_wall_ms"], 3)
    out["added_median_cpu_ms"] = round(out["with"]["median_cpu_ms"] - out["without"]["median_cpu_ms"], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="runs per variant and backend")
    parser.add_argument("--block", type=int, default=20, help="runs per alternating block")
    parser.add_argument("--backends", nargs="+", default=["bwrap", "docker"])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "sandbox_isolation.json"))
    args = parser.parse_args()
    report = {
        "benchmark": "per-run cost of run isolation and tmpfs sizes (see benchmarks/sandbox_isolation.py)",
        "command": COMMAND,
        "machine": {"cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(),
                    "kernel": platform.release(), "loadavg_1min_before": round(os.getloadavg()[0], 2)},
        "notes": ["docker median_cpu_ms counts only this process (the dispatcher runs in the container); "
                  "its reset shows in the wall time, which includes the container's answer."],
        "backends": {},
    }
    for backend in args.backends:
        if backend == "bwrap":
            with_box, without_box = get_sandbox("bwrap", limits=LIMITS), BwrapWithoutIsolation(limits=LIMITS)
        else:
            with_box = get_sandbox("docker", limits=LIMITS, pool_size=1)
            real_source = docker_pool.DISPATCHER_SOURCE
            docker_pool.DISPATCHER_SOURCE = dispatcher_without_reset(real_source)
            try:
                without_box = get_sandbox("docker", limits=LIMITS, pool_size=1)
                without_box.warm(1)  # the container starts now, with the patched dispatcher
            finally:
                docker_pool.DISPATCHER_SOURCE = real_source
        try:
            report["backends"][backend] = compare(with_box, without_box, args.runs, args.block)
        finally:
            with_box.close()
            without_box.close()
        print(backend, json.dumps(report["backends"][backend]), flush=True)
    report["machine"]["loadavg_1min_after"] = round(os.getloadavg()[0], 2)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
