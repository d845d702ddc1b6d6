"""``reward.judge``: an LLM judge behind an OpenAI-compatible endpoint (``POST <url>/chat/completions``).

Each sample is one request: the template filled with the row's question, the response and the ground truth as the
user message; the answer's text (or its first token's top log-probs) goes through the parser to a score in [0, 1]
(``parse_scale``, ``parse_verdict``, ``parse_logprob``). An answer the parser cannot read is a failure of that sample
(no verdict), as are timeouts and HTTP errors after their retries.
"""
from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

from reasonrl.config.reward_sources_schema import JudgeConfig
from reasonrl.verifiers import VerifyResult

from .handles import FutureHandle, call, score_problem
from .http_json import EndpointClient, EndpointError
from .items import prompt_text

_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


class Unparsable(ValueError):
    """The judge's answer holds no score the parser can read."""


def parse_scale(text: str, low: float, high: float) -> float:
    """The last number in ``text`` on the scale [low, high], mapped to [0, 1]; Unparsable when there is none or it
    is off the scale."""
    numbers = _NUMBER.findall(text or "")
    if not numbers:
        raise Unparsable(f"no number in the judge's answer {text!r:.120}")
    value = float(numbers[-1])
    if not low <= value <= high:
        raise Unparsable(f"the judge's number {value:g} is off the scale [{low:g}, {high:g}]")
    return (value - low) / (high - low)


def parse_verdict(text: str, verdicts: Mapping[str, float]) -> float:
    """The score of the verdict word found first in ``text`` (case-insensitive, whole words); Unparsable when none
    is there."""
    best: Optional[tuple] = None
    for word, score in verdicts.items():
        match = re.search(rf"(?<![\w]){re.escape(word.strip())}(?![\w])", text or "", flags=re.IGNORECASE)
        if match and (best is None or match.start() < best[0]):
            best = (match.start(), float(score))
    if best is None:
        raise Unparsable(f"none of the verdicts {sorted(verdicts)} in the judge's answer {text!r:.120}")
    return best[1]


def parse_logprob(top_logprobs: Sequence[Mapping[str, Any]], verdicts: Mapping[str, float]) -> float:
    """Sum over the verdict tokens among the first token's ``top_logprobs`` (``[{"token", "logprob"}]``; a token
    matches a verdict when they are equal after stripping and lower-casing) of p(token) * its score, divided by the
    verdicts' total probability; Unparsable when no verdict token is among them."""
    wanted = {w.strip().lower(): float(s) for w, s in verdicts.items()}
    mass, weighted = 0.0, 0.0
    for entry in top_logprobs or []:
        token = str(entry.get("token", "")).strip().lower()
        logprob = entry.get("logprob")
        if token in wanted and isinstance(logprob, (int, float)) and math.isfinite(logprob):
            p = math.exp(logprob)
            mass += p
            weighted += p * wanted[token]
    if mass <= 0:
        tokens = [e.get("token") for e in (top_logprobs or [])][:8]
        raise Unparsable(f"no verdict token {sorted(wanted)} among the first token's top log-probs {tokens}")
    return weighted / mass


def judge_message(cfg: JudgeConfig, item: Any) -> str:
    """The template filled for one item."""
    row = getattr(item, "row", {}) or {}
    ground_truth = item[2]
    return cfg.template.format(prompt=prompt_text(row), response=item[1],
                               ground_truth="" if ground_truth is None else ground_truth)


def completions_url(url: str) -> str:
    """``<url>/chat/completions`` unless ``url`` already ends so."""
    url = url.rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


class JudgeSource:
    """``submit(items)``: one chat-completion request per item, at most ``concurrency`` at once."""

    name = "judge"

    def __init__(self, cfg: JudgeConfig, score_range: Sequence[float]) -> None:
        self.cfg = cfg
        self.score_range = tuple(score_range)
        self.url = completions_url(cfg.url)
        self.client = EndpointClient(cfg, "judge")

    def request(self, item: Any) -> Dict[str, Any]:
        """The chat-completion request body for one item."""
        body: Dict[str, Any] = {"model": self.cfg.model, "temperature": float(self.cfg.temperature),
                                "messages": [{"role": "user", "content": judge_message(self.cfg, item)}],
                                "max_tokens": int(self.cfg.max_tokens)}
        if self.cfg.parser == "logprob":
            body.update(max_tokens=1, logprobs=True, top_logprobs=int(self.cfg.top_logprobs))
        return body

    def submit(self, items: Sequence[Any]) -> FutureHandle:
        parts = [([i], self.client.submit(call(self._judge, item))) for i, item in enumerate(items)]
        return FutureHandle(len(items), parts, self.name)

    def _judge(self, item: Any) -> List[VerifyResult]:
        where = f"judge {self.cfg.model!r} at {self.cfg.url}"
        try:
            answer = self.client.post(self.request(item), url=self.url)
        except EndpointError as exc:
            return [VerifyResult.failure(f"{where}: {type(exc).__name__}: {exc}",
                                         timed_out="Timeout" in type(exc).__name__)]
        try:
            choice = answer["choices"][0]
            text = choice["message"]["content"] or ""
            if self.cfg.parser == "scale":
                score = parse_scale(text, *self.cfg.scale)
            elif self.cfg.parser == "verdict":
                score = parse_verdict(text, self.cfg.verdicts)
            else:
                score = parse_logprob(choice["logprobs"]["content"][0]["top_logprobs"], self.cfg.verdicts)
        except Unparsable as exc:
            return [VerifyResult.failure(f"{where}: unparsable answer: {exc}", judge_text=_text_of(answer))]
        except (KeyError, IndexError, TypeError) as exc:
            return [VerifyResult.failure(f"{where}: the answer is not a chat completion ({type(exc).__name__}: "
                                         f"{exc}): {answer!r:.160}", garbage=True)]
        problem = score_problem(score, self.score_range)
        if problem:
            return [VerifyResult.failure(f"{where}: {problem}")]
        return [VerifyResult(score=score, correct=score >= float(self.cfg.correct_above),
                             info={"reason": f"judge ({self.cfg.parser})", "judge_text": text[:500]})]

    def pop_stats(self) -> Dict[str, float]:
        return self.client.pop_stats("reward_source/judge")

    def close(self) -> None:
        self.client.close()


def _text_of(answer: Any) -> str:
    try:
        return str(answer["choices"][0]["message"]["content"])[:500]
    except (KeyError, IndexError, TypeError):
        return ""
