"""Ctrl-C at a step boundary: the first SIGINT (or SIGTERM) asks the trainer to stop after the step in flight and its
checkpoint; a second one aborts at once without saving (the last complete checkpoint stays the resume point).

Stopping between steps is what makes the saved state exactly the state of the step it is named after: a step
interrupted half-way has already changed the weights (its update ran) or the data position (its prompts were
drawn), so it is either finished or never saved.
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
    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""

    def _handle(self, signum, _frame) -> None:
        if self.requested:  # the second signal: abort now, no save
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        print(f"\nreasonrl: {self.signal_name}: finishing the step in flight, then saving a checkpoint and stopping "
              "(press Ctrl-C again to abort without saving)", file=sys.stderr, flush=True)


@contextmanager
def stop_at_step_boundary() -> Iterator[StopRequest]:
    """Install the SIGINT/SIGTERM handlers for the duration of the block (signals reach only the main thread:
    elsewhere the block runs without them)."""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {s: signal.signal(s, stop._handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
