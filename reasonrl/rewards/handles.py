"""What a reward source's ``submit`` returns: ``done()`` without waiting, ``result()`` (results in input order), the
same two calls as ``VerifierPool.submit``'s ``Submission``."""
from __future__ import annotations

import math
from concurrent.futures import CancelledError, Future
from typing import Callable, List, Sequence, Tuple

from reasonrl.verifiers import VerifyResult

from .redact import excerpt, redact


class FutureHandle:
    """Results from futures, each covering some of the items: ``parts`` is ``[(indices, future)]`` where the future
    gives one VerifyResult per index. A future that raises fails its items, the reason naming the source and the
    error (redacted of ``secrets``, the source's API key and URL credentials); a cancelled one (the source was
    closed) raises."""

    def __init__(self, count: int, parts: Sequence[Tuple[List[int], Future]], source: str,
                 secrets: Sequence[str] = ()) -> None:
        self.count = count
        self.parts = list(parts)
        self.source = source
        self.secrets = list(secrets)
        self._results: List[VerifyResult] = []

    def __len__(self) -> int:
        return self.count

    def done(self) -> bool:
        return all(f.done() for _, f in self.parts)

    def result(self) -> List[VerifyResult]:
        if self._results or not self.count:
            return self._results
        out: List[VerifyResult] = [VerifyResult.failure(f"{self.source}: no result")] * self.count
        for indices, future in self.parts:
            try:
                results = future.result()
            except CancelledError:
                raise RuntimeError(f"reward source {self.source} is closed") from None
            except Exception as exc:  # noqa: BLE001  (a bug or an outage: the items fail, named)
                reason = redact(f"{self.source}: {type(exc).__name__}: {exc}", self.secrets)
                results = [VerifyResult.failure(reason)] * len(indices)
            for i, r in zip(indices, results):
                out[i] = r
        self._results = out
        return out


def score_problem(score: object, score_range: Sequence[float], secrets: Sequence[str] = ()) -> str:
    """Why ``score`` is not a usable score (a finite number inside ``score_range``), or ``""`` (a score that is not a
    number is shown redacted of ``secrets``)."""
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        return f"the score {excerpt(score, 60, secrets)} is not a number"
    if not math.isfinite(score):
        return f"the score {score} is not finite"
    low, high = score_range
    if not low <= score <= high:
        return f"the score {score:g} is outside reward.score_range [{low:g}, {high:g}]"
    return ""


def batched(indices: Sequence[int], size: int) -> List[List[int]]:
    """``indices`` cut into runs of at most ``size``."""
    return [list(indices[i:i + size]) for i in range(0, len(indices), size)]


def call(fn: Callable, *args) -> Callable[[], object]:
    """``fn`` bound to ``args`` (a thunk for a thread pool)."""
    return lambda: fn(*args)
