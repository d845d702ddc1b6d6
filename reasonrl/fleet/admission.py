"""Admission control for fully asynchronous training (issue #48 item 1): staleness bounded by pacing, not discarding.

Pure bookkeeping: no I/O, no clock, no threads. The caller passes timestamps (``now=``) where it wants waits in
seconds; without them the waits are counted in refused calls.

Versions and batches. The trainer consumes batches ``0, 1, 2, ...`` of ``B`` prompt groups each, one per step, and
step ``i`` trains on the weights of version ``i`` (version = steps trained so far); the *training version* of batch
``i`` is ``i``. ``publish(v)`` tells the fleet that version ``v`` is the newest it may generate with; ``v`` never
decreases and never exceeds the number of batches taken (a trainer may publish late, never early). So at published
version ``v`` the batches ``< v`` are all taken and the trainer's next steps consume batches ``v, v+1, ...``.

The admission rule, with ``max_staleness = k >= 0``: a group admitted at published version ``v`` is assigned to the
earliest batch that is not full (fewer than ``B`` groups admitted and not failed) and is admitted only if that
batch's index ``j`` satisfies ``j <= v + k``; otherwise ``admit`` says None (wait, try again later). Its *start
version* is ``v`` (with partial rollouts off, the version of its first token), and its lag when trained is
``j - v``, in ``[0, k]``. Hence at most ``(v + k + 1 - taken) * B`` groups are in flight or queued, and ``k = 0`` is
on-policy: only the batch the trainer consumes next may be filled. ``take_batch`` asserts the bound.

Nothing is discarded for being late: a group that finishes out of order waits in its batch, and a batch is taken only
when all ``B`` of its groups finished ok, so a long response delays its batch instead of being dropped (a discard
policy biases training towards short responses). A group that fails, or is filtered, frees its slot and the next
``admit`` fills the earliest such hole with another prompt. ``take_batch`` lists a batch's groups in the order
they finished ok.

Partial rollouts (issue #48 item 2) will make a group's tokens span versions: ``finished(..., versions=(oldest,
newest))`` takes the oldest and newest version of the group's tokens; the lag is then counted from the oldest, which
can be no older than the start version, so the bound above still holds.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Hashable, List, Optional, Tuple

GroupId = Hashable


class AdmissionError(RuntimeError):
    """A call out of protocol: an unknown or repeated group, a version that goes back or runs ahead of the trainer."""


@dataclass
class _Group:
    batch: int
    start_version: int
    tokens: int = 0
    oldest_version: Optional[int] = None
    """The oldest version of the group's tokens (partial rollouts); the start version when not given."""


@dataclass
class _Wait:
    """One side's waiting: refused calls, and seconds between the first refused call and the next granted one."""

    calls: int = 0
    seconds: float = 0.0
    since: Optional[float] = None

    def refused(self, now: Optional[float]) -> None:
        self.calls += 1
        if now is not None and self.since is None:
            self.since = now

    def granted(self, now: Optional[float]) -> None:
        if now is not None and self.since is not None:
            self.seconds += max(0.0, now - self.since)
        self.since = None


@dataclass
class AdmissionController:
    """Admits prompt groups into training batches so that none is trained more than ``max_staleness`` versions after
    the version that started it (the module docstring states the rule)."""

    batch_size: int
    """Prompt groups per training batch (``B``)."""
    max_staleness: int
    """``k``: the most versions between a group's start and its training; 0 is on-policy."""
    version: int = field(default=0, init=False)
    """The newest published weight version."""
    taken: int = field(default=0, init=False)
    """Batches taken by the trainer; the next one taken is batch ``taken``, trained at version ``taken``."""
    lag_groups: Counter = field(default_factory=Counter, init=False)
    """Trained groups per version lag."""
    lag_tokens: Counter = field(default_factory=Counter, init=False)
    """Trained tokens per version lag (the tokens given to ``finished``)."""
    failed: int = field(default=0, init=False)
    """Groups that finished not ok (failed or filtered) and freed their slot."""
    trainer_wait: _Wait = field(default_factory=_Wait, init=False)
    """How long the trainer waited in ``take_batch`` for a complete batch."""
    fleet_wait: _Wait = field(default_factory=_Wait, init=False)
    """How long the fleet waited in ``admit`` for room."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise AdmissionError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.max_staleness < 0:
            raise AdmissionError(f"max_staleness must be >= 0, got {self.max_staleness}")
        self._groups: Dict[GroupId, _Group] = {}
        self._running: set = set()
        self._batches: Dict[int, List[GroupId]] = {}
        """Batch index -> its groups (running or finished ok), not yet taken."""
        self._ready: Dict[int, List[GroupId]] = {}
        """Batch index -> its groups that finished ok, in finishing order."""

    def start_at(self, version: int) -> None:
        """A resumed run: ``version`` batches were trained before it (the next one taken is batch ``version``, at
        published version ``version``). Only before anything was admitted."""
        if self._groups or self.taken or self.version:
            raise AdmissionError("start_at after admissions began")
        self.version = self.taken = version

    # ------------------------------------------------------------------ the fleet's side

    def open_batch(self) -> int:
        """The earliest batch not full: the one the next admitted group would join."""
        index = self.taken
        while len(self._batches.get(index, ())) >= self.batch_size:
            index += 1
        return index

    def admit(self, group_id: GroupId, now: Optional[float] = None) -> Optional[int]:
        """Start ``group_id`` at the current version: the batch index it is assigned, or None (wait: its batch would
        be trained more than ``max_staleness`` versions from now)."""
        if group_id in self._groups:
            raise AdmissionError(f"group {group_id!r} is already admitted")
        index = self.open_batch()
        if index > self.version + self.max_staleness:
            self.fleet_wait.refused(now)
            return None
        self.fleet_wait.granted(now)
        self._groups[group_id] = _Group(batch=index, start_version=self.version)
        self._batches.setdefault(index, []).append(group_id)
        self._running.add(group_id)
        return index

    def finished(self, group_id: GroupId, ok: bool, tokens: int = 0,
                 versions: Optional[Tuple[int, int]] = None) -> None:
        """``group_id``'s generation (and verification) ended. ``ok=False`` (failed or filtered) frees its slot for
        another prompt. ``tokens``: its response tokens (for the token lag histogram). ``versions``: the oldest and
        newest version of its tokens, for partial rollouts (default: the start version only)."""
        if group_id not in self._running:
            raise AdmissionError(f"group {group_id!r} is not running (never admitted, or already finished)")
        self._running.discard(group_id)
        group = self._groups[group_id]
        if not ok:
            self.failed += 1
            self._batches[group.batch].remove(group_id)
            del self._groups[group_id]
            return
        if versions is not None:
            oldest, newest = versions
            if not group.start_version <= oldest <= newest <= self.version:
                raise AdmissionError(f"group {group_id!r}: token versions {versions} outside "
                                     f"[start {group.start_version}, published {self.version}]")
            group.oldest_version = oldest
        group.tokens = tokens
        self._ready.setdefault(group.batch, []).append(group_id)

    # ------------------------------------------------------------------ the trainer's side

    def take_batch(self, now: Optional[float] = None) -> Optional[List[GroupId]]:
        """The next batch's groups (in the order they finished ok) when all ``B`` finished ok, else None (wait)."""
        index = self.taken
        ready = self._ready.get(index, [])
        if len(ready) < self.batch_size:
            self.trainer_wait.refused(now)
            return None
        self.trainer_wait.granted(now)
        for group_id in ready:
            group = self._groups.pop(group_id)
            oldest = group.start_version if group.oldest_version is None else group.oldest_version
            lag = index - oldest
            assert 0 <= index - group.start_version <= self.max_staleness, (
                f"group {group_id!r} started at version {group.start_version}, trained at {index}: "
                f"beyond max_staleness {self.max_staleness}")
            self.lag_groups[lag] += 1
            self.lag_tokens[lag] += group.tokens
        del self._ready[index], self._batches[index]
        self.taken += 1
        return list(ready)

    def publish(self, version: int) -> None:
        """The fleet now generates with weights ``version`` (at most the number of batches taken)."""
        if version < self.version or version > self.taken:
            raise AdmissionError(f"publish({version}): must be within [current {self.version}, "
                                 f"batches taken {self.taken}]")
        self.version = version

    # ------------------------------------------------------------------ metrics

    @property
    def in_flight(self) -> int:
        """Groups admitted and not finished."""
        return len(self._running)

    @property
    def ready(self) -> int:
        """Groups finished ok and not yet taken."""
        return sum(len(groups) for groups in self._ready.values())

    def metrics(self) -> Dict[str, float]:
        """Queue depth, waits and the version-lag histograms (``admission/lag_groups/<lag>``, ``.../lag_tokens/``)."""
        out = {"admission/in_flight": float(self.in_flight), "admission/ready": float(self.ready),
               "admission/failed": float(self.failed), "admission/version": float(self.version),
               "admission/trainer_wait_calls": float(self.trainer_wait.calls),
               "admission/trainer_wait_s": self.trainer_wait.seconds,
               "admission/fleet_wait_calls": float(self.fleet_wait.calls),
               "admission/fleet_wait_s": self.fleet_wait.seconds}
        for lag in range(self.max_staleness + 1):
            out[f"admission/lag_groups/{lag}"] = float(self.lag_groups[lag])
            out[f"admission/lag_tokens/{lag}"] = float(self.lag_tokens[lag])
        return out
