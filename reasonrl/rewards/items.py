"""From a dataset row and a response to a reward item: which sources score it (and with what weights), which
verifier, the ground truth and the extras (shared by training and evaluation).

Which sources score a row (``sources_for``): ``reward.sources`` when the user sets it (forces them for every row),
else the row's ``reward_model.sources`` (``{source: weight}``), else its ``reward_model.style`` (``rule``, ``model``,
``judge``, ``remote`` or a plugin's source, registry.py: that source alone), else ``rule``. A ``RewardItem`` (frozen)
is what the router takes: the VerifierPool's ``(verifier, response, ground_truth, extra)`` (``pool_item``) with the
row and the source weights.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from reasonrl.config.schema import RewardConfig
from reasonrl.config.tasks import verifier_for_data_source

from .registry import DEFAULT_SOURCE, REWARD_SOURCES, check_source_weights, ordered_sources, read_sources


@dataclass(frozen=True)
class RewardItem:
    """One response to score, as the reward router takes it: the rule ``verifier`` (None when the row has no rule
    source), the ``response``, the ``ground_truth``, the verifier's ``extra`` keywords, the dataset ``row`` (prompt
    messages, data_source, ...) and its ``sources`` (``{source: weight}``)."""

    verifier: Optional[str]
    response: str
    ground_truth: Any
    extra: Dict[str, Any] = field(default_factory=dict)
    row: Dict[str, Any] = field(default_factory=dict)
    sources: Dict[str, float] = field(default_factory=lambda: {DEFAULT_SOURCE: 1.0})

    def __post_init__(self) -> None:  # own copies: the dataset's row is never shared with a source
        object.__setattr__(self, "extra", dict(self.extra or {}))
        object.__setattr__(self, "row", dict(self.row or {}))
        object.__setattr__(self, "sources", dict(self.sources or {DEFAULT_SOURCE: 1.0}))

    def pool_item(self) -> Tuple[Optional[str], str, Any, Dict[str, Any]]:
        """The VerifierPool's ``(verifier, response, ground_truth, extra)``."""
        return (self.verifier, self.response, self.ground_truth, self.extra)


def rule_verifier_for(row: Dict[str, Any], reward: RewardConfig) -> str:
    """The verifier that scores ``row``'s rule source: ``reward.verifier`` when the user forces one, else the row's
    ``verifier`` column, else the task registry's verifier for its ``data_source``."""
    if reward.verifier:
        return reward.verifier
    if row.get("verifier"):
        return row["verifier"]
    source = row.get("data_source", "")
    verifier = verifier_for_data_source(source)
    if verifier is not None:
        return verifier
    raise ValueError(f"no verifier for data_source {source!r}: add a 'verifier' column or set reward.verifier=")


def sources_for(row: Dict[str, Any], reward: RewardConfig) -> Dict[str, float]:
    """``{source: weight}`` for ``row`` (module docstring); ValueError naming what is wrong."""
    if reward.sources:
        return check_source_weights(reward.sources, "reward.sources")
    spec = row.get("reward_model") or {}
    if not isinstance(spec, Mapping):
        return {DEFAULT_SOURCE: 1.0}
    if spec.get("sources") is not None:
        return check_source_weights(spec["sources"], "the row's reward_model.sources")
    style = spec.get("style") or DEFAULT_SOURCE
    if style not in REWARD_SOURCES:
        raise ValueError(f"the row's reward_model.style is {style!r}; known: {', '.join(ordered_sources())} (or give "
                         f"reward_model.sources={{source: weight}})")
    return {style: 1.0}


def source_label(source: str, row: Dict[str, Any], reward: RewardConfig) -> str:
    """How one source of ``row`` is logged (its class's ``label_for``: the verifier's name for ``rule``)."""
    return REWARD_SOURCES[source].label_for(row, reward)


def verifier_for(row: Dict[str, Any], reward: RewardConfig) -> str:
    """The name ``row``'s rewards are logged under (``reward/<name>/...``): its rule verifier (``math``), a source
    (``reward_model``, ``judge``, ``remote``), or the sources of a combination joined by ``+`` (``math+reward_model``)."""
    return "+".join(source_label(s, row, reward) for s in ordered_sources(sources_for(row, reward)))


def check_verifiers(rows: Sequence[Dict[str, Any]], reward: RewardConfig, what: str) -> List[str]:
    """Before anything loads: every row of ``what`` (a data split) resolves to sources that are configured and, for
    its rule source, to a verifier that is registered (built in or installed through the entry-point group);
    DataError naming the first row that does not. Returns the names the rows are logged under, sorted."""
    from reasonrl.datasets import DataError
    from reasonrl.verifiers import available_verifiers

    known, used = set(available_verifiers()), set()
    states = read_sources(reward)
    for i, row in enumerate(rows):
        try:
            sources = sources_for(row, reward)
            name = verifier_for(row, reward)
        except ValueError as exc:
            raise DataError(f"{what}: row {i}: {exc}") from None
        for source in sources:
            if not states[source][1]:
                raise DataError(f"{what}: row {i} (data_source {row.get('data_source')!r}) is scored by the source "
                                f"{source!r}, but {REWARD_SOURCES[source].off_hint()}")
        if "rule" in sources:
            verifier = rule_verifier_for(row, reward)
            if verifier not in known:
                where = "reward.verifier" if reward.verifier else f"row {i} (data_source {row.get('data_source')!r})"
                raise DataError(f"{what}: {where} names the verifier {verifier!r}, which is not registered; known: "
                                f"{', '.join(sorted(known))} (plugins register through the 'reasonrl.verifiers' "
                                f"entry-point group)")
        used.add(name)
    return sorted(used)


def verify_item(row: Dict[str, Any], response: str, reward: RewardConfig) -> RewardItem:
    """The ``RewardItem`` of ``row`` and ``response``: its rule verifier, ground truth and extras, the row and its
    sources, for the reward router."""
    extra = {k: v for k, v in (row.get("extra_info") or {}).items() if v is not None}
    sources = sources_for(row, reward)
    verifier = rule_verifier_for(row, reward) if "rule" in sources else None
    ground_truth = (row.get("reward_model") or {}).get("ground_truth")
    return RewardItem(verifier, response, ground_truth, extra, row=row, sources=sources)


def prompt_text(row: Dict[str, Any]) -> str:
    """The row's question for a judge or an endpoint: its last user message (the whole prompt when it is text)."""
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return prompt
    for message in reversed(list(prompt or [])):
        if isinstance(message, Mapping) and message.get("role") == "user":
            return str(message.get("content", ""))
    return ""


def prompt_messages(row: Dict[str, Any]) -> List[Dict[str, str]]:
    """The row's prompt as chat messages (a text prompt becomes one user message)."""
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [{"role": str(m.get("role", "user")), "content": str(m.get("content", ""))} for m in (prompt or [])]


Item = Tuple[Any, ...]
