"""``reward.remote``: a user's own scoring service behind a small HTTP JSON contract (docs/rewards.md).

Request: ``POST <reward.remote.url>`` with ``{"items": [{"prompt": [messages], "response": str, "ground_truth": ...,
"data_source": str, "extra_info": {...}}, ...]}`` (at most ``batch_size`` items). Answer: HTTP 200 with
``{"results": [...]}``, one entry per item in order, each ``{"score": number, "correct": bool (optional), "info":
{...} (optional)}`` or ``{"error": "why"}``. A timeout, a refused connection, an HTTP error, an answer over
``max_response_bytes``, an answer that is not JSON or not of this shape, a missing or non-finite score, or a score
outside ``reward.score_range`` fails the samples it covers (named, never scored 0); timeouts, refusals and
408/429/5xx are retried first. A result keeps only ``info``'s short flat values (``kept_info``), redacted, never
the answer itself.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Sequence

from reasonrl.config.reward_sources_schema import RemoteRewardConfig
from reasonrl.verifiers import VerifyResult

from .handles import FutureHandle, batched, call, score_problem
from .http_json import EndpointClient, EndpointError
from .items import prompt_messages
from .redact import excerpt, redact, safe_url
from .registry import RewardSource, register_reward_source

INFO_KEYS = 16
"""Most entries of a result's ``info`` that are kept."""
INFO_CHARS = 200
"""Longest string of a result's ``info`` that is kept (longer ones are cut)."""


def item_payload(item: Any) -> Dict[str, Any]:
    """One sample as the contract sends it."""
    row = item.row
    return {"prompt": prompt_messages(row), "response": item.response, "ground_truth": item.ground_truth,
            "data_source": row.get("data_source"), "extra_info": dict(item.extra)}


def kept_info(info: Any, secrets: Sequence[str] = ()) -> Dict[str, Any]:
    """What a result keeps of the service's ``info``: at most ``INFO_KEYS`` entries whose values are None, a bool, a
    finite number or a string (redacted, cut at ``INFO_CHARS``); nested values and the rest are dropped, counted in
    ``info_dropped``."""
    if not isinstance(info, Mapping):
        return {}
    kept: Dict[str, Any] = {}
    for key, value in info.items():
        if len(kept) >= INFO_KEYS:
            break
        if value is None or isinstance(value, bool) or (isinstance(value, (int, float)) and math.isfinite(value)):
            kept[redact(key, secrets)[:INFO_CHARS]] = value
        elif isinstance(value, str):
            kept[redact(key, secrets)[:INFO_CHARS]] = redact(value, secrets)[:INFO_CHARS]
    if len(kept) < len(info):
        kept["info_dropped"] = len(info) - len(kept)
    return kept


def parse_results(answer: Any, count: int, score_range: Sequence[float], correct_above: float,
                  where: str, secrets: Sequence[str] = ()) -> List[VerifyResult]:
    """The ``count`` results of one answer (``where`` names the service in the reasons; ``secrets`` are redacted
    from every text taken from the answer): each a verdict, or a failure when its entry (or the whole answer) breaks
    the contract."""
    results = answer.get("results") if isinstance(answer, Mapping) else None
    if not isinstance(results, list) or len(results) != count:
        got = (f"{len(results)} results" if isinstance(results, list)
               else f"{type(answer).__name__} {excerpt(answer, 120, secrets)}")
        return [VerifyResult.failure(f"{where}: the answer breaks the contract (want {{'results': [...]}} with "
                                     f"{count} entries, got {got})", garbage=True)] * count
    out = []
    for entry in results:
        if not isinstance(entry, Mapping):
            out.append(VerifyResult.failure(f"{where}: a result is {excerpt(entry, 80, secrets)}, not an object",
                                            garbage=True))
        elif entry.get("error") is not None:
            why = redact(entry["error"], secrets)
            out.append(VerifyResult.failure(f"{where}: the service could not score it: {why:.200}"))
        elif problem := score_problem(entry.get("score"), score_range, secrets):
            out.append(VerifyResult.failure(f"{where}: {problem}", garbage=True))
        else:
            score = float(entry["score"])
            correct = entry.get("correct")
            info = kept_info(entry.get("info"), secrets)
            info.setdefault("reason", "scored by the remote endpoint")
            out.append(VerifyResult(score=score, correct=bool(correct) if isinstance(correct, bool)
                                    else score >= correct_above, info=info))
    return out


@register_reward_source("remote")
class RemoteRewardSource(RewardSource):
    """``submit(items)`` posts the items in batches of ``batch_size``, at most ``concurrency`` requests at once."""

    order = 3
    schema = RemoteRewardConfig
    settings_key = "reward.remote"
    switch = "url"

    def __init__(self, cfg: RemoteRewardConfig, score_range: Sequence[float]) -> None:
        self.cfg = cfg
        self.score_range = tuple(score_range)
        self.client = EndpointClient(cfg, "remote")

    def submit(self, items: Sequence[Any]) -> FutureHandle:
        parts = []
        for indices in batched(range(len(items)), int(self.cfg.batch_size)):
            batch = [items[i] for i in indices]
            parts.append((indices, self.client.submit(call(self._score, batch))))
        return FutureHandle(len(items), parts, self.name, self.client.secrets)

    def _score(self, batch: List[Any]) -> List[VerifyResult]:
        where = f"remote endpoint {safe_url(self.cfg.url)}"
        try:
            answer = self.client.post({"items": [item_payload(item) for item in batch]})
        except EndpointError as exc:
            attempts = 1 + int(self.cfg.retries) if exc.retryable else None
            tried = f" (after {attempts} attempts)" if attempts and attempts > 1 else ""
            return [VerifyResult.failure(self.client.redact(f"{where}: {type(exc).__name__}: {exc}{tried}"),
                                         timed_out="Timeout" in type(exc).__name__)] * len(batch)
        return parse_results(answer, len(batch), self.score_range, float(self.cfg.correct_above), where,
                             self.client.secrets)

    def pop_stats(self) -> Dict[str, float]:
        return self.client.pop_stats("reward_source/remote")

    def close(self) -> None:
        self.client.close()

