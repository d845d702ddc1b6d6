"""The settings of the shipped reward sources beyond the rule verifiers: ``reward.model`` (a reward model on its own
pool), ``reward.judge`` (an LLM judge behind an OpenAI-compatible endpoint) and ``reward.remote`` (a user's scoring
service).

In ``schema.py`` each is one dict field of ``RewardConfig`` (so the generated reference keeps one row per key); this
module holds their typed form, one docstring per field, and their checks (each dataclass's ``check(key)``). Each
source's class (rewards/registry.py) names its dataclass; ``build_section`` turns a dict into it: an unknown key, a
bad value, a template without the response slot or a URL that is not http(s) raises ``SectionError`` naming the key
(``load.validate`` reports it as a ConfigError, before anything loads). docs/rewards.md describes every field.
"""
from __future__ import annotations

import dataclasses
import math
import string
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional
from urllib.parse import urlsplit

TEMPLATE_SLOTS = ("prompt", "response", "ground_truth")
"""The slots a judge template may use; ``{response}`` is required."""


class SectionError(ValueError):
    """A bad key or value in one of these sections; ``key`` is the full config key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"config key '{key}': {message}")
        self.key = key
        self.message = message


@dataclass
class EndpointConfig:
    """What every HTTP source shares: where it is, how many calls at once, how long each may take, how often to
    retry."""

    url: Optional[str] = None
    """The endpoint (http:// or https://). None: the source is off."""
    concurrency: int = 4
    """Most requests in flight at once (the rest wait their turn), so a burst never floods the service."""
    timeout_s: float = 30.0
    """Wall-clock limit of one request (connect, send, the whole answer); past it the attempt fails as a timeout."""
    retries: int = 2
    """Extra attempts after a timeout, a refused connection or an HTTP 408/429/5xx; a 4xx or an unreadable answer is
    not retried. After the last attempt the sample fails (no verdict, never a 0)."""
    backoff_s: float = 0.5
    """Wait before the first retry; it doubles for each further retry (exponential backoff)."""
    max_backoff_s: float = 8.0
    """The longest wait between two attempts."""
    api_key_env: Optional[str] = None
    """An environment variable holding a bearer token sent as ``Authorization: Bearer ...`` (None: no header). With
    the source on (``url`` set), a variable that is not set or empty where the run starts is a config error (its
    value is never printed). The only way to give a credential: a URL with one in it (``https://user:pass@host``) is
    refused, as the URL is written to the run's config.yaml and log; the token never appears in a failure reason
    (redacted)."""
    max_response_bytes: int = 1048576
    """Largest answer read (bytes, default 1 MiB); a larger one is not read further and fails its samples, the
    reason naming this key (not retried)."""
    correct_above: float = 0.5
    """A score at or above this counts as correct (accuracy, pass@k) when the answer does not say itself."""

    def check(self, key: str) -> None:
        """SectionError naming the key: a URL that is not http(s) or carries credentials."""
        if self.url is not None:
            check_url(self.url, f"{key}.url")

    def check_environment(self, key: str, environ: Mapping[str, str]) -> None:
        """The ``api_key_env`` variable is set and non-empty in ``environ`` (checked before anything starts, for a
        source that is on); SectionError naming the key and the variable, never a value."""
        if self.api_key_env and not environ.get(self.api_key_env):
            raise SectionError(f"{key}.api_key_env", f"names the environment variable {self.api_key_env}, which is "
                                                     f"not set (or is empty): export it before starting, or drop the "
                                                     f"key for an endpoint that needs no token")


@dataclass
class JudgeConfig(EndpointConfig):
    """``reward.judge``: an LLM judge behind an OpenAI-compatible ``/chat/completions`` endpoint (``vllm serve``
    and the other serving stacks)."""

    model: str = ""
    """The model name the endpoint serves (the request's ``model``)."""
    template: Optional[str] = None
    """The judge's user message, with slots ``{prompt}`` (the row's last user message), ``{response}`` (required)
    and ``{ground_truth}``; literal braces are doubled. It must ask for the parser's form (a last line
    ``Verdict: <word>`` or ``Score: <n>``). None: a grading prompt that asks for it (rewards/judge_parse.py)."""
    parser: str = "verdict"
    """How the judge's answer becomes a score, read from its final verdict only: verdict (a last line ``Verdict:
    <word>``, a word of ``verdicts``, gives its score), scale (a last line ``Score: <n>``, n on ``scale``, mapped to
    [0, 1]), logprob (one token, the probability-weighted score of the ``verdicts`` among the first token's top
    log-probs). No verdict in the form, or labelled verdict lines that disagree, is a failure."""
    scale: List[float] = field(default_factory=lambda: [0.0, 10.0])
    """parser=scale: [low, high] of the judge's number; low scores 0, high 1; a number outside is a failure, and so is
    ``n/d`` or ``n out of d`` with d other than high."""
    verdicts: Dict[str, float] = field(default_factory=lambda: {"yes": 1.0, "no": 0.0})
    """parser=verdict or logprob: each verdict word (case-insensitive, the whole verdict) and its score."""
    max_tokens: int = 16
    """Most tokens the judge writes (parser=logprob asks for one)."""
    top_logprobs: int = 20
    """parser=logprob: how many of the first token's most likely tokens the endpoint returns."""
    temperature: float = 0.0
    """The judge's sampling temperature (0: greedy, so the same answer gets the same score)."""

    def check(self, key: str) -> None:
        """The endpoint's checks, the template's slots, the parser, its scale and verdicts, and the model name."""
        super().check(key)
        if self.template is not None:
            check_template(self.template, f"{key}.template")
        if self.parser not in ("scale", "verdict", "logprob"):
            raise SectionError(f"{key}.parser", f"must be scale, verdict or logprob, got {self.parser!r}")
        if len(self.scale) != 2 or not self.scale[0] < self.scale[1]:
            raise SectionError(f"{key}.scale", f"must be [low, high] with low < high, got {list(self.scale)}")
        if not self.verdicts or not all(isinstance(k, str) and k.strip() for k in self.verdicts):
            raise SectionError(f"{key}.verdicts", f"must map verdict words to scores, got {dict(self.verdicts)}")
        if self.url and not self.model:
            raise SectionError(f"{key}.model", "must name the model the endpoint serves (the request's 'model')")


@dataclass
class RemoteRewardConfig(EndpointConfig):
    """``reward.remote``: a scoring service of the user's own, speaking the JSON contract of docs/rewards.md."""

    batch_size: int = 16
    """Samples per request."""


@dataclass
class RewardModelConfig:
    """``reward.model``: a Hugging Face sequence-classification model that scores (prompt, response) pairs on its
    own pool of Ray actors (``placement``'s ``reward_model`` role)."""

    path: Optional[str] = None
    """The model directory or hub id (``AutoModelForSequenceClassification``, one label: its logit is the score).
    None: the source is off."""
    batch_size: int = 8
    """Pairs per forward pass."""
    max_length: int = 1024
    """A pair longer than this many tokens (after the chat template) is cut from the left (the prompt's start)."""
    transform: str = "sigmoid"
    """The score from the logit: sigmoid (into (0, 1), inside the default ``reward.score_range``) or raw (the logit
    itself; widen ``reward.score_range`` to hold it)."""
    dtype: str = "float32"
    """Parameter dtype: float32, bfloat16, float16."""
    timeout_s: float = 600.0
    """Longest wait for one batch's scores; past it (or when an actor dies) the batch's samples fail."""
    correct_above: float = 0.5
    """A score at or above this counts as correct (accuracy, pass@k)."""

    def check(self, key: str) -> None:
        """The transform and the dtype are known ones."""
        if self.transform not in ("sigmoid", "raw"):
            raise SectionError(f"{key}.transform", f"must be sigmoid or raw, got {self.transform!r}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise SectionError(f"{key}.dtype", f"must be float32, bfloat16 or float16, got {self.dtype!r}")


_POSITIVE = {"concurrency", "timeout_s", "batch_size", "max_length", "max_tokens", "top_logprobs", "max_backoff_s",
             "max_response_bytes"}
_NON_NEGATIVE = {"retries", "backoff_s", "temperature"}


def build_section(cls, values: Optional[Mapping[str, Any]], prefix: str):
    """``cls`` from a dict (``prefix``: its config key), with an error naming the first unknown key or number out of
    range (a positive count or duration, a non-negative retry count, backoff or temperature), then the dataclass's
    own ``check(prefix)`` when it has one."""
    names = {f.name: f for f in dataclasses.fields(cls)}
    values = dict(values or {})
    for key in values:
        if key not in names:
            raise SectionError(f"{prefix}.{key}", f"unknown key; known: {', '.join(sorted(names))}")
    built = cls(**values)
    for name in names:
        value = getattr(built, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value) or (name in _POSITIVE and value <= 0) or (name in _NON_NEGATIVE and value < 0):
            raise SectionError(f"{prefix}.{name}", f"{value} is out of range; allowed: "
                                                   f"{'> 0' if name in _POSITIVE else '>= 0'}")
    check = getattr(built, "check", None)
    if check is not None:
        check(prefix)
    return built


def check_url(url: Any, key: str) -> None:
    """An http:// or https:// URL with a host and no credentials in it, else SectionError naming ``key`` (a URL
    with credentials is refused without being repeated: the message would carry them)."""
    parts = urlsplit(str(url))
    if "@" in parts.netloc:
        raise SectionError(key, "has credentials in it (user:password@host), which would be written to the run's "
                                "config.yaml and log; drop them and name an environment variable holding the token in "
                                f"{key.rsplit('.', 1)[0]}.api_key_env")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        shown = "the value" if "@" in str(url) else repr(url)
        raise SectionError(key, f"{shown} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)")


def check_template(template: Any, key: str) -> None:
    """A judge template: a string with the ``{response}`` slot and no slot outside ``TEMPLATE_SLOTS``."""
    if not isinstance(template, str):
        raise SectionError(key, f"must be a string, got {type(template).__name__} (quote it on the command line: "
                                f"{key}=\"'...{{response}}...'\", or YAML reads the braces as a mapping)")
    try:
        slots = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise SectionError(key, f"is not a valid template ({exc}); write literal braces as {{{{ and }}}}") from None
    unknown = sorted(slots - set(TEMPLATE_SLOTS))
    if unknown:
        raise SectionError(key, f"unknown slot {{{unknown[0]}}}; the slots are "
                                f"{', '.join('{' + s + '}' for s in TEMPLATE_SLOTS)}")
    if "response" not in slots:
        raise SectionError(key, "has no {response} slot: the judge would never see the response it grades")


