"""Running a batch's environment steps concurrently, each under a time limit, without ever waiting on a hung one.

Each job runs in a daemon thread of its own (at most ``concurrency`` at once, in waves), so a step that hangs past
its limit is reported as timed out and abandoned: it cannot block the rollout, nor the interpreter's exit. A job
that raises is reported with its exception. Imports neither torch nor ray.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

StepOutcome = Tuple[Optional[Any], Optional[str]]
"""(the job's value, None), or (None, why it failed: "timed out after ..." or the exception)."""


def run_jobs(jobs: Sequence[Callable[[], Any]], timeouts_s: Sequence[float], concurrency: int) -> List[StepOutcome]:
    """Run ``jobs`` (in waves of ``concurrency`` threads); job ``i`` may take ``timeouts_s[i]`` seconds from the
    start of its wave. Results in input order."""
    out: List[StepOutcome] = [(None, "not run")] * len(jobs)
    width = max(1, concurrency)
    for start in range(0, len(jobs), width):
        wave = range(start, min(len(jobs), start + width))
        slots = {}
        began = time.monotonic()
        for i in wave:
            done, box = threading.Event(), {}

            def target(job=jobs[i], done=done, box=box) -> None:
                try:
                    box["value"] = job()
                except BaseException as exc:  # an environment that breaks its no-raise contract
                    box["error"] = f"{type(exc).__name__}: {exc}"
                finally:
                    done.set()

            threading.Thread(target=target, daemon=True, name=f"env-step-{i}").start()
            slots[i] = (done, box)
        for i in wave:
            done, box = slots[i]
            if not done.wait(max(0.0, began + timeouts_s[i] - time.monotonic())):
                out[i] = (None, f"timed out after {timeouts_s[i]:g} s")
            elif "error" in box:
                out[i] = (None, box["error"][:300])
            else:
                out[i] = (box["value"], None)
    return out
