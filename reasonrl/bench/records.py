"""Writing a benchmark's result JSON: atomically, and whatever happens (``recorded``); the default results folder.

The scripts in ``benchmarks/`` run from a source checkout (``pip install -e .`` or ``PYTHONPATH`` at its root, as
``benchmarks/gpu_run.sh`` sets on the GPU machine), so ``RESULTS`` is that checkout's ``benchmarks/results``.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
"""The checkout's ``benchmarks/`` folder (its scripts, ``plugins/`` and ``results/``)."""
RESULTS = BENCH_DIR / "results"


def seconds_since_process_start() -> Optional[float]:
    """Wall seconds since this process was started (Linux: its start time in ``/proc/self/stat`` against the system's
    uptime), so a launch-to-first-step figure counts the interpreter's start and the imports; None elsewhere."""
    try:
        stat = Path("/proc/self/stat").read_text()
        start_ticks = int(stat[stat.rindex(")") + 2:].split()[19])  # field 22, after the command name in parentheses
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def write(out: Path, result: Dict[str, Any]) -> None:
    """``result`` as JSON at ``out``, replaced atomically (a reader never sees half a file)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str))
    os.replace(tmp, out)


@contextlib.contextmanager
def recorded(out: Path, result: Dict[str, Any], wall_start: float) -> Iterator[None]:
    """Run a benchmark's body so that its JSON is written whatever happens: afterwards ``result["status"]`` is
    ``ok``, or ``failed`` with the traceback in ``result["error"]`` (the exception is recorded, not raised), and
    ``result["wall_s"]`` counts from ``wall_start``. A failed or cut-off device call still leaves its partial
    figures on disk."""
    try:
        yield
        result["status"] = "ok"
    except Exception:
        result["status"] = "failed"
        result["error"] = traceback.format_exc()
        print(result["error"], flush=True)
    finally:
        result["wall_s"] = time.perf_counter() - wall_start
        write(out, result)


def exit_with_status(result: Dict[str, Any]) -> None:
    """Exit 0 when the benchmark's ``status`` is ``ok``, else 1."""
    sys.exit(0 if result["status"] == "ok" else 1)
