"""The reward router: the object ``make_pool`` returns. It has the VerifierPool's interface (``submit``,
``verify_batch``, ``pop_stats``, ``close``, a context manager) and sends each item to its sources — the rule
verifier pool, the reward model, the judge, the remote endpoint — then combines them per row.

Combination (a row with several sources, ``RewardItem.sources`` = ``{source: weight}``): the score is
``sum(weight * source score)``; ``correct`` is the rule verifier's verdict when the row has a rule source, else
whether every source counted it correct; ``info["sources"]`` holds each source's score and reason. When any of the
row's sources fails, the row fails (no verdict), its reason naming the source: a partial sum would be a different
reward scale, and a failure is never a 0. A row with one source gets that source's result unchanged.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence

from reasonrl.config.reward_sources_schema import SOURCES
from reasonrl.verifiers import VerifyResult

from .items import SOURCE_LABELS


def _sources_of(item: Any) -> Dict[str, float]:
    return dict(getattr(item, "sources", None) or {"rule": 1.0})


class RouterSubmission:
    """``done()`` / ``result()`` over the sources' own submissions."""

    def __init__(self, router: "RewardRouter", items: Sequence[Any], parts: Dict[str, tuple]) -> None:
        self.router = router
        self.weights = [_sources_of(item) for item in items]
        self.parts = parts  # source -> (indices, handle)
        self._results: Optional[List[VerifyResult]] = None

    def __len__(self) -> int:
        return len(self.weights)

    def done(self) -> bool:
        return self._results is not None or all(handle.done() for _, handle in self.parts.values())

    def result(self) -> List[VerifyResult]:
        if self._results is None:
            by_source: List[Dict[str, VerifyResult]] = [{} for _ in self.weights]
            for source, (indices, handle) in self.parts.items():
                results = handle.result()
                for i, r in zip(indices, results):
                    by_source[i][source] = r
                self.router._observe(source, results)
            self._results = [combine(w, got) for w, got in zip(self.weights, by_source)]
        return self._results


def combine(weights: Dict[str, float], results: Dict[str, VerifyResult]) -> VerifyResult:
    """One row's result from its sources' (module docstring)."""
    if len(weights) == 1:
        return results[next(iter(weights))]
    ordered = [s for s in SOURCES if s in weights]
    breakdown = {s: {"score": results[s].score, "weight": weights[s], "failed": results[s].failed,
                     "reason": results[s].info.get("reason")} for s in ordered}
    failed = [s for s in ordered if results[s].failed]
    if failed:
        reasons = "; ".join(f"{_label(s)}: {results[s].info.get('reason', '?')}" for s in failed)
        return VerifyResult.failure(f"no verdict from {', '.join(_label(s) for s in failed)} ({reasons})",
                                    sources=breakdown)
    score = sum(weights[s] * float(results[s].score) for s in ordered)
    correct = results["rule"].correct if "rule" in results else all(results[s].correct for s in ordered)
    info = dict(results["rule"].info) if "rule" in results else {}
    info["reason"] = " + ".join(f"{weights[s]:g} x {_label(s)} {results[s].score:.4g}" for s in ordered)
    info["sources"] = breakdown
    return VerifyResult(score=score, correct=bool(correct), info=info)


def _label(source: str) -> str:
    return SOURCE_LABELS.get(source, source)


class RewardRouter:
    """Items to their sources (``sources``: name -> an object with ``submit``/``pop_stats``/``close``; ``rule`` is
    the VerifierPool). Thread-safe as its sources are."""

    def __init__(self, sources: Dict[str, Any]) -> None:
        self.sources = dict(sources)
        self._scores: Dict[str, List[float]] = {}
        self._failed: Dict[str, int] = {}
        self._lock = threading.Lock()  # submissions may be collected on other threads (async, streaming)

    @property
    def rule_pool(self):
        """The VerifierPool behind the rule source."""
        return self.sources["rule"]

    def submit(self, items: Sequence[Any]) -> RouterSubmission:
        """Queue every item at its sources and return at once (``result()`` waits, input order)."""
        wanted: Dict[str, List[int]] = {}
        for i, item in enumerate(items):
            for source in _sources_of(item):
                wanted.setdefault(source, []).append(i)
        missing = sorted(set(wanted) - set(self.sources))
        if missing:
            raise ValueError(f"items ask for the reward source(s) {', '.join(missing)}, which this run did not "
                             f"configure (reward.model.path, reward.judge.url, reward.remote.url)")
        parts = {}
        for source, indices in wanted.items():
            picked = [items[i] for i in indices]
            if source == "rule":  # the verifier pool takes plain 4-tuples
                picked = [item.pool_item() for item in picked]
            parts[source] = (indices, self.sources[source].submit(picked))
        return RouterSubmission(self, items, parts)

    def verify_batch(self, items: Sequence[Any]) -> List[VerifyResult]:
        """Score every item; results in input order."""
        return self.submit(items).result()

    def _observe(self, source: str, results: Sequence[VerifyResult]) -> None:
        if source == "rule":
            return
        with self._lock:
            self._scores.setdefault(source, []).extend(r.score for r in results if not r.failed)
            self._failed[source] = self._failed.get(source, 0) + sum(r.failed for r in results)

    def pop_stats(self) -> Dict[str, float]:
        """The verifier pool's ``verify/*`` counters and, per other source, ``reward_source/<label>/*`` (requests,
        retries, timeouts, errors, latency, failed, score_mean) since the last call."""
        stats: Dict[str, float] = {}
        for source, backend in self.sources.items():
            stats.update(backend.pop_stats())
        for source in [s for s in self.sources if s != "rule"]:
            with self._lock:
                scores, failed = self._scores.pop(source, []), self._failed.pop(source, 0)
            stats[f"reward_source/{_label(source)}/failed"] = float(failed)
            stats[f"reward_source/{_label(source)}/scored"] = float(len(scores))
            if scores:
                stats[f"reward_source/{_label(source)}/score_mean"] = sum(scores) / len(scores)
        return stats

    def close(self) -> None:
        """Close every source (idempotent)."""
        for backend in self.sources.values():
            backend.close()

    def __enter__(self) -> "RewardRouter":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
