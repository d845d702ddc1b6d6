"""The per-phase watchdog: a worker phase (one call on every worker: generate, compute_log_probs, update_actor,
sync_weights, ...) that runs far beyond its recent median, or beyond an absolute ceiling, is a hang. The run then
names the phase and the ranks that did not answer, prints each such worker's Python stacks, and exits non-zero
(``reasonrl.train`` exit status 4) instead of waiting forever.

``WorkerGroup`` asks ``limit_s(phase)`` before it waits, reports each finished call's duration to ``record`` and
calls ``hung`` when the limit passes.
"""
from __future__ import annotations

import statistics
import sys
from collections import defaultdict, deque
from typing import Deque, Dict, List, Optional

EXIT_HUNG = 4
"""Exit status of a run stopped by the watchdog."""

HISTORY = 20
"""Durations remembered per phase (the median is over these)."""
MIN_HISTORY = 3
"""Calls of a phase seen before its median counts (the first calls include warm-up and compilation)."""


class PhaseHangError(RuntimeError):
    """A worker phase ran past its watchdog limit; the message names the phase and the ranks."""


def phase_limit_s(history: List[float], factor: float, min_s: float, max_s: float) -> Optional[float]:
    """Seconds a phase may run: ``factor`` x the median of its recent durations, at least ``min_s``, at most
    ``max_s``; ``max_s`` alone until ``MIN_HISTORY`` calls are known; None when ``max_s`` is 0 (watchdog off)."""
    if max_s <= 0:
        return None
    if len(history) < MIN_HISTORY:
        return max_s
    return min(max_s, max(min_s, factor * statistics.median(history)))


class PhaseWatchdog:
    def __init__(self, factor: float, min_s: float, max_s: float) -> None:
        self.factor, self.min_s, self.max_s = factor, min_s, max_s
        self.history: Dict[str, Deque[float]] = defaultdict(lambda: deque(maxlen=HISTORY))

    def limit_s(self, phase: str) -> Optional[float]:
        return phase_limit_s(list(self.history[phase]), self.factor, self.min_s, self.max_s)

    def record(self, phase: str, seconds: float) -> None:
        self.history[phase].append(seconds)

    def hung(self, group: str, phase: str, ranks: List[int], waited_s: float, stacks: Dict[int, str]) -> None:
        """Print what hung and where, then raise PhaseHangError."""
        known = list(self.history[phase])
        basis = (f"median {statistics.median(known):.1f} s over {len(known)} calls x {self.factor:g}, at least "
                 f"{self.min_s:g} s" if len(known) >= MIN_HISTORY else "no history yet")
        msg = (f"watchdog: phase '{phase}' ({group}) has not finished on rank(s) {', '.join(map(str, ranks))} after "
               f"{waited_s:.0f} s (limit {self.limit_s(phase):.0f} s: {basis}; ceiling trainer.watchdog_max_s="
               f"{self.max_s:g})")
        print(f"reasonrl: {msg}", file=sys.stderr, flush=True)
        for rank in ranks:
            print(f"---- stacks of {group} rank {rank} ----\n{stacks.get(rank) or '(no stack dump)'}",
                  file=sys.stderr, flush=True)
        raise PhaseHangError(msg)
