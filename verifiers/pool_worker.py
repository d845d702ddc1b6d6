"""The VerifierPool worker process: ``python -m reasonrl.verifiers.pool_worker READ_FD WRITE_FD``.

A fresh interpreter (never a fork of the trainer, never a re-import of the trainer's main module), so it
holds neither torch nor ray nor the trainer's threads. Protocol over two pipes (multiprocessing
Connections, pickled messages):

- parent -> worker: first ``{"verifier_options": {...}, "score_range": (low, high)}``, then chunks ``[(name, ground_truth, extra,
  [(task_id, response), ...]), ...]``, and finally ``None`` (exit).
- worker -> parent: ``("ready", pid)`` once warmed up, then one ``(task_id, score, correct, info,
  latency_s, failed)`` per response, sent as soon as that call finishes, so that the parent always knows
  which call is running (for its per-call timeout). ``failed``: no verdict (``VerifyResult.failed``).
"""
from __future__ import annotations

import os
import pickle
import sys
import time
from multiprocessing.connection import Connection
from typing import Any, Dict, Tuple

from .base import Verifier, VerifyResult, available_verifiers, get_verifier, verdict_problem

ResultMessage = Tuple[int, float, bool, Dict[str, Any], float, bool]


def warm_up() -> None:
    """Load the built-in and plugin verifiers and the math stack, so the first call is not slow."""
    available_verifiers()
    try:
        get_verifier("math").verify("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}")  # imports sympy
    except Exception:  # a broken math stack shows up on the first real call, with its reason
        pass


class _Verifiers:
    """One verifier instance per name, built on first use with the pool's options for that name."""

    def __init__(self, options: Dict[str, Dict[str, Any]]) -> None:
        self.options = options
        self.instances: Dict[str, Verifier] = {}

    def get(self, name: str) -> Verifier:
        if name not in self.instances:
            self.instances[name] = get_verifier(name, **self.options.get(name, {}))
        return self.instances[name]


def run_one(verifiers: _Verifiers, name: str, response: Any, ground_truth: Any, extra: Dict[str, Any],
            score_range: Tuple[float, float] = (0.0, 1.0)) -> VerifyResult:
    """The verdict on one call, or a failure (``VerifyResult.failed``) naming the verifier when it raised, returned
    something that is not a ``VerifyResult``, or a score that is not finite or not inside ``score_range``."""
    try:
        result = verifiers.get(name).verify(response, ground_truth, **extra)
    except Exception as exc:  # a verifier must not raise; if it does, the call has no verdict
        return VerifyResult.failure(f"verifier {name!r} raised {type(exc).__name__}: {exc}"[:500],
                                    error=repr(exc)[:500])
    problem = verdict_problem(result, score_range)
    if problem is not None:
        return VerifyResult.failure(f"verifier {name!r} {problem}"[:500], error=problem[:200])
    return result


def serve(inbox: Connection, outbox: Connection) -> None:
    """Answer chunks until the parent sends ``None`` or goes away."""
    settings = inbox.recv()
    verifiers = _Verifiers(settings.get("verifier_options") or {})
    score_range = tuple(settings.get("score_range") or (0.0, 1.0))
    warm_up()
    outbox.send(("ready", os.getpid()))
    while True:
        try:
            chunk = inbox.recv()
        except (EOFError, OSError):
            return
        if chunk is None:
            return
        for name, ground_truth, extra, tasks in chunk:
            for task_id, response in tasks:
                started = time.perf_counter()
                result = run_one(verifiers, name, response, ground_truth, extra or {}, score_range)
                latency = time.perf_counter() - started
                try:
                    outbox.send((task_id, float(result.score), bool(result.correct) and not result.failed,
                                 result.info, latency, bool(result.failed)))
                except (pickle.PicklingError, TypeError, AttributeError) as exc:  # info that cannot travel
                    outbox.send((task_id, 0.0, False, {"reason": f"verifier {name!r}: result info not picklable: "
                                                                 f"{exc}"[:300], "error": "unpicklable info"},
                                 latency, True))


def main(argv: list) -> None:
    """Entry point: ``READ_FD WRITE_FD`` are the pipe ends this process inherited."""
    inbox = Connection(int(argv[1]), writable=False)
    outbox = Connection(int(argv[2]), readable=False)
    try:
        serve(inbox, outbox)
    except (BrokenPipeError, EOFError, KeyboardInterrupt):
        pass


if __name__ == "__main__":
    main(sys.argv)
