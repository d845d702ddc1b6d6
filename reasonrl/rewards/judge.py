"""``reward.judge``: an LLM judge behind an OpenAI-compatible endpoint (``POST <url>/chat/completions``).

Each sample is one request: the template (by default one that asks for the parser's form, ``default_template``)
filled with the row's question, the response and the ground truth as the user message; the answer's text (or its
first token's top log-probs) goes through the parser to a score in [0, 1] (``parse_scale``, ``parse_verdict``,
``parse_logprob`` in judge_parse.py: the judge's final verdict in the asked form, never the response's own words).
An answer the parser cannot read or finds ambiguous is a failure of that sample (no verdict), as are timeouts, HTTP
errors after their retries and answers over ``max_response_bytes``. Reasons and the kept judge text are redacted.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

from reasonrl.config.reward_sources_schema import JudgeConfig
from reasonrl.verifiers import VerifyResult

from .handles import FutureHandle, call, score_problem
from .http_json import EndpointClient, EndpointError
from .items import prompt_text
from .judge_parse import Unparsable, default_template, parse_logprob, parse_scale, parse_verdict
from .redact import safe_url
from .registry import RewardSource, register_reward_source

__all__ = ["JudgeSource", "Unparsable", "completions_url", "judge_message", "parse_logprob", "parse_scale",
           "parse_verdict"]

JUDGE_TEXT_CHARS = 500
"""How much of the judge's answer a result keeps (``info["judge_text"]``, redacted)."""


def judge_message(cfg: JudgeConfig, item: Any) -> str:
    """The template (``cfg.template``, else the parser's ``default_template``) filled for one item."""
    row = item.row
    ground_truth = item.ground_truth
    template = cfg.template if cfg.template is not None else default_template(cfg.parser, cfg.scale, cfg.verdicts)
    return template.format(prompt=prompt_text(row), response=item.response,
                           ground_truth="" if ground_truth is None else ground_truth)


def completions_url(url: str) -> str:
    """``<url>/chat/completions`` unless ``url`` already ends so."""
    url = url.rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


@register_reward_source("judge")
class JudgeSource(RewardSource):
    """``submit(items)``: one chat-completion request per item, at most ``concurrency`` at once."""

    order = 2
    schema = JudgeConfig
    settings_key = "reward.judge"
    switch = "url"

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
        return FutureHandle(len(items), parts, self.name, self.client.secrets)

    def _judge(self, item: Any) -> List[VerifyResult]:
        where = f"judge {self.cfg.model!r} at {safe_url(self.cfg.url)}"
        try:
            answer = self.client.post(self.request(item), url=self.url)
        except EndpointError as exc:
            return [VerifyResult.failure(self.client.redact(f"{where}: {type(exc).__name__}: {exc}"),
                                         timed_out="Timeout" in type(exc).__name__)]
        try:
            choice = answer["choices"][0]
            content = choice["message"]["content"] or ""
            if not isinstance(content, str):
                raise TypeError(f"the message's content is {type(content).__name__}, not text")
            text = self.client.redact(content)  # before anything quotes it (a key is never half shown)
            if self.cfg.parser == "scale":
                score = parse_scale(text, *self.cfg.scale, quoted=item.response)
            elif self.cfg.parser == "verdict":
                score = parse_verdict(text, self.cfg.verdicts, quoted=item.response)
            else:
                score = parse_logprob(choice["logprobs"]["content"][0]["top_logprobs"], self.cfg.verdicts)
        except Unparsable as exc:
            return [VerifyResult.failure(self.client.redact(f"{where}: unparsable answer: {exc}"),
                                         judge_text=text[:JUDGE_TEXT_CHARS])]
        except (KeyError, IndexError, TypeError) as exc:
            return [VerifyResult.failure(f"{where}: the answer is not a chat completion ({type(exc).__name__}: "
                                         f"{self.client.excerpt(str(exc), 80)}): {self.client.excerpt(answer, 160)}",
                                         garbage=True)]
        problem = score_problem(score, self.score_range)
        if problem:
            return [VerifyResult.failure(f"{where}: {problem}")]
        return [VerifyResult(score=score, correct=score >= float(self.cfg.correct_above),
                             info={"reason": f"judge ({self.cfg.parser})", "judge_text": text[:JUDGE_TEXT_CHARS]})]

    def pop_stats(self) -> Dict[str, float]:
        return self.client.pop_stats("reward_source/judge")

    def close(self) -> None:
        self.client.close()

