"""Ctrl-C at a boundary: the first SIGINT (or SIGTERM) asks the loop to stop once the unit of work in flight is done
and saved (the trainer's step and its checkpoint, the evaluation's batch of samples); a second one aborts at once
without saving (what was saved before stays the resume point).

Stopping between units is what makes the saved state exactly the state it is named after: a training step
interrupted half-way has already changed the weights (its update ran) or the data position (its prompts were drawn),
so it is either finished or never saved.

The handler only records the request; the loop reads ``StopRequest.requested`` at its boundary. Raising
``KeyboardInterrupt`` from the handler instead would land wherever the main thread happens to be, including places
that swallow exceptions (a ``__del__``, a library's broad ``except``), and the stop could be lost.
"""
from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

EXIT_INTERRUPTED = 130
"""Exit status of a run stopped by Ctrl-C/SIGTERM (128 + SIGINT, as shells report it)."""


class StopRequest:
    def __init__(self, plan: str) -> None:
        self.plan = plan
        self.requested = False
        self.signal_name = ""

    def _handle(self, signum, _frame) -> None:
        if self.requested:  # the second signal: abort now, no save
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        print(f"\nreasonrl: {self.signal_name}: {self.plan} (press Ctrl-C again to abort without saving)",
              file=sys.stderr, flush=True)


@contextmanager
def stop_at_boundary(plan: str) -> Iterator[StopRequest]:
    """Install the SIGINT/SIGTERM handlers for the duration of the block; ``plan`` is what the first signal's message
    says will happen (signals reach only the main thread: elsewhere the block runs without them)."""
    stop = StopRequest(plan)
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {s: signal.signal(s, stop._handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
