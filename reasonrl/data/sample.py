"""The Sample record: one response, from the engine to collation, with everything the step needs about it.

A round of ``P`` prompts with ``n`` responses each is a ``Round``: the prompts, their dataset positions and
``P * n`` Samples, grouped by prompt (``Sample.group`` is the prompt's position in the round). The engines' output
(a Batch whose meta has one entry per response: ``prompt_row``, ``response_ids``, ...) becomes Samples once, in
``samples_from_generation``; the verifier is chosen once per sample (``reasonrl.rewards.verify_item``) and its result
stored on it; collation, metrics, the sample log, dynamic sampling and checkpoints read Samples.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence

import torch

from .batch import Batch
from .collate import collate_rollout

TOOL_STATS = ("turns", "tool_calls", "tool_errors", "tool_timeouts", "tool_seconds")
"""The tool loop's per-response counters (``rollout.multiturn.tool_meta``)."""

ROW_KEYS = ("prompt_row", "prompt_ids", "response_ids", "response_text", "rollout_log_probs", "finish_reason",
            "tool_mask", "weights_version")
"""The engines' per-response meta that becomes a Sample's own fields; any other column (the tool loop's counters,
an environment's name, reward, drift and conversation) goes to ``Sample.extra``."""


@dataclass
class Sample:
    """One sampled response and what is known about it."""

    prompt: Any
    """The dataset prompt (``reasonrl.data.prompts.Prompt``: its row and token ids)."""
    group: int
    """The prompt's position in its round: the responses of one prompt share it (their group)."""
    response_ids: List[int]
    """Generated token ids (tool turns included in a multi-turn rollout)."""
    response_text: str
    """The decoded response."""
    rollout_log_probs: List[float]
    """The engine's per-token log-probs (empty when training rollouts do not ask for them)."""
    finish_reason: str
    """``stop`` or ``length`` (the engine's)."""
    tool_mask: Optional[List[int]] = None
    """1 for tokens a tool wrote (left out of the loss); None for a plain rollout."""
    extra: Dict[str, Any] = field(default_factory=dict)
    """The engines' other per-response fields: the tool loop's counters (``TOOL_STATS``) and, with environments,
    ``env``, ``env_reward``, ``env_failed``, ``env_drift``, ``calls_per_tool``, ``malformed_calls``,
    ``conversation`` (``reasonrl.envs.metrics``)."""
    weights_version: Optional[int] = None
    """The step whose weights generated it (async rollout workers stamp it; None when colocated)."""
    verifier: str = ""
    """The verifier that scores it (chosen once, from the row or ``reward.verifier``)."""
    result: Any = None
    """Its ``VerifyResult`` (``score``, ``correct``, ``failed``, ``info``)."""

    @property
    def prompt_ids(self) -> List[int]:
        return self.prompt.token_ids


def columns(samples: Sequence[Sample], keys: Sequence[str]) -> Dict[str, List[Any]]:
    """The ``extra`` fields ``keys`` of ``samples`` as per-response columns (the keys every sample has)."""
    return {k: [s.extra[k] for s in samples] for k in keys if samples and all(k in s.extra for s in samples)}


@dataclass
class Round:
    """One rollout round: the prompts (one per group), the positions they were drawn from, and the Samples."""

    prompts: List[Any]
    samples: List[Sample]
    indices: List[int] = field(default_factory=list)
    """The prompts' positions in the training dataset (for the per-prompt statistics); empty once groups are
    selected from several rounds."""

    @property
    def results(self) -> List[Any]:
        return [s.result for s in self.samples]

    def group_index(self) -> torch.Tensor:
        """[R] the group of each sample (the advantage estimators' grouping)."""
        return torch.tensor([s.group for s in self.samples], dtype=torch.long)

    def select_groups(self, groups: Sequence[int]) -> "Round":
        """The sub-round of ``groups`` in the given order, renumbered 0.. (prompts, their samples, no indices)."""
        where = {g: i for i, g in enumerate(groups)}
        by_group: Dict[int, List[Sample]] = {}
        for s in self.samples:
            if s.group in where:
                by_group.setdefault(s.group, []).append(replace(s, group=where[s.group]))
        return Round([self.prompts[g] for g in groups], [s for g in groups for s in by_group.get(g, [])])

    @staticmethod
    def concat(rounds: Sequence["Round"]) -> "Round":
        """Rounds one after another, groups renumbered (no indices: the rows come from several draws)."""
        prompts: List[Any] = []
        samples: List[Sample] = []
        for rnd in rounds:
            offset = len(prompts)
            prompts += rnd.prompts
            samples += [replace(s, group=s.group + offset) for s in rnd.samples]
        return Round(prompts, samples)


def samples_from_generation(prompts: Sequence[Any], gen: Batch) -> List[Sample]:
    """The engines' rows as Samples: meta ``prompt_row`` (the prompt's position in ``prompts``), ``response_ids``,
    ``response_text``, ``rollout_log_probs``, ``finish_reason``; optional ``tool_mask`` and ``weights_version``; the
    other columns (``ROW_KEYS`` aside) go to ``Sample.extra``. No verifier yet (``attach_results``)."""
    has_tools = "tool_mask" in gen
    versions = gen["weights_version"] if "weights_version" in gen else None
    others = [k for k in gen.meta if k not in ROW_KEYS]
    out = []
    for j, row in enumerate(gen["prompt_row"]):
        out.append(Sample(
            prompt=prompts[row], group=row, response_ids=gen["response_ids"][j], response_text=gen["response_text"][j],
            rollout_log_probs=gen["rollout_log_probs"][j], finish_reason=gen["finish_reason"][j],
            tool_mask=gen["tool_mask"][j] if has_tools else None, extra={k: gen[k][j] for k in others},
            weights_version=None if versions is None else versions[j]))
    return out


def attach_results(samples: Sequence[Sample], items: Sequence[Any], results: Sequence[Any]) -> None:
    """Store each sample's result (and, when no label was set, its verifier: the first field of its pool item)."""
    if len(results) != len(samples):
        raise RuntimeError(f"the verifiers returned {len(results)} results for {len(samples)} responses")
    for s, item, r in zip(samples, items, results):
        s.result = r
        s.verifier = s.verifier or item[0]


def collate_samples(samples: Sequence[Sample], pad_id: int) -> Batch:
    """The padded training tensors of ``samples`` (``collate_rollout``; tool masks when the rollout had tools)."""
    tools = samples[0].tool_mask is not None if samples else False
    return collate_rollout([s.prompt_ids for s in samples], [s.response_ids for s in samples],
                           [s.rollout_log_probs for s in samples], pad_id,
                           [s.tool_mask for s in samples] if tools else None)
