"""The Sample record: one response, born in the engine host, with everything the step needs about it.

The engine host (``reasonrl.workers.engine_host``) turns each of the engine's (or the tool loop's) completions into a
``Sample``: the token ids, the engine's log-probs, the group (the prompt's position in the round, handed to the
engines with the prompts), the finish reason and, from the tool loop, the tools' and the environment's outcomes
(``ToolOutcome``, ``EnvOutcome``). Samples cross Ray as plain dataclasses of lists and numbers. On the driver each is
bound to its prompt (``bind_prompts``), gets its verifier and result (``attach_results``), and a ``Round`` holds the
prompts, their dataset positions and the Samples, grouped by ``Sample.group`` (``Round.groups``); collation, metrics,
the sample log, dynamic sampling and checkpoints read Samples.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .batch import Batch
from .collate import collate_rollout


@dataclass(frozen=True)
class ToolOutcome:
    """What the tool loop counted in one trajectory (``reasonrl.rollout.multiturn.ToolCompletion``)."""

    turns: int = 0
    """Model turns (generate calls)."""
    tool_calls: int = 0
    """Tool calls that ran."""
    tool_errors: int = 0
    """Calls that failed (an error observation)."""
    tool_timeouts: int = 0
    """Calls stopped at their time limit (also counted in ``tool_errors``)."""
    tool_seconds: float = 0.0
    """Wall-clock seconds of the trajectory's environment steps, summed."""
    malformed_calls: int = 0
    """Calls that could not be parsed or were over a limit."""
    calls_per_tool: Dict[str, int] = field(default_factory=dict)
    """Calls that ran, by tool name."""

    @classmethod
    def of(cls, c: Any) -> "ToolOutcome":
        return cls(c.turns, c.tool_calls, c.tool_errors, c.tool_timeouts, c.tool_seconds, c.malformed_calls,
                   dict(c.calls_per_tool))


@dataclass(frozen=True)
class EnvOutcome:
    """What the environment of one trajectory gave (``reasonrl.rollout.multiturn.ToolCompletion``)."""

    name: str = ""
    """The environment it ran in ("": a plain prompt in the tool loop)."""
    failed: str = ""
    """Why the environment failed ("": it did not); the sample then has no verdict."""
    reward: float = math.nan
    """The last reward the environment gave (NaN: none)."""
    step_rewards: Tuple[float, ...] = ()
    """Each step's reward, in order (NaN for a step that gave none)."""
    drift: int = -1
    """1: boundary drift between the trained tokens and the template's rendering; 0: none; -1: unchecked."""
    noncanonical: int = -1
    """1: only the model's own token split differs from the rendering; 0: not so; -1: unchecked."""
    conversation: Tuple[Dict[str, str], ...] = ()
    """The messages after the prompt (assistant and tool turns), for the sample log."""

    @classmethod
    def of(cls, c: Any) -> "EnvOutcome":
        return cls(c.env, c.env_failed, c.env_reward, tuple(c.step_rewards), c.env_drift, c.env_noncanonical,
                   tuple(c.conversation))


@dataclass
class Sample:
    """One sampled response and what is known about it."""

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
    tools: Optional[ToolOutcome] = None
    """The tool loop's counts (None: a plain rollout)."""
    env: Optional[EnvOutcome] = None
    """The environment's outcome (None: a plain rollout)."""
    weights_version: Optional[int] = None
    """The step whose weights generated it (async rollout workers stamp it; None when colocated). A partial rollout
    (``reasonrl.rollout.partial``), whose tokens may come from several versions, sets it to ``oldest_version``: the
    version lag the metrics compute from it (``trainer/metrics.py``) is then that of its stalest token."""
    token_versions: Optional[List[int]] = None
    """The weight version that generated each token of ``response_ids`` (same length, never decreasing), recorded
    by a partial rollout; None when the rollout recorded no per-token versions (then ``weights_version``, if set,
    holds for every token)."""
    oldest_version: Optional[int] = None
    """The version of the first response token (``token_versions[0]``); None without per-token versions."""
    newest_version: Optional[int] = None
    """The version of the last response token (``token_versions[-1]``); equal to ``oldest_version`` when the
    weights did not change while it was generated; None without per-token versions."""
    joined_running: bool = False
    """In-engine partial rollouts: its replica call's requests joined another call's running engine steps
    (``rollout.step_loop``), instead of starting an idle engine."""
    prompt: Any = None
    """The dataset prompt (``reasonrl.data.prompts.Prompt``: its row and token ids), bound on the driver
    (``bind_prompts``); None as the engine host returns it."""
    verifier: str = ""
    """The verifier that scores it (chosen once, from the row or ``reward.verifier``)."""
    result: Any = None
    """Its ``VerifyResult`` (``score``, ``correct``, ``failed``, ``info``)."""

    @property
    def prompt_ids(self) -> List[int]:
        return self.prompt.token_ids


def bind_prompts(samples: Sequence[Sample], prompts: Sequence[Any]) -> List[Sample]:
    """Each sample bound to its prompt, ``prompts[sample.group]`` (the prompts of the round, in group order)."""
    for s in samples:
        if not 0 <= s.group < len(prompts):
            raise RuntimeError(f"a sample of group {s.group} in a round of {len(prompts)} prompts")
        s.prompt = prompts[s.group]
    return list(samples)


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

    def groups(self) -> List[List[Sample]]:
        """The Samples of each prompt, by ``Sample.group``: entry ``g`` holds group ``g``'s samples in round order
        (one entry per prompt; a group whose samples were all dropped is empty)."""
        out: List[List[Sample]] = [[] for _ in self.prompts]
        for s in self.samples:
            if not 0 <= s.group < len(out):
                raise ValueError(f"a sample of group {s.group} in a round of {len(out)} prompts")
            out[s.group].append(s)
        return out

    def group_index(self) -> torch.Tensor:
        """[R] the group of each sample (the advantage estimators' grouping)."""
        return torch.tensor([s.group for s in self.samples], dtype=torch.long)

    def select_groups(self, groups: Sequence[int]) -> "Round":
        """The sub-round of ``groups`` in the given order, renumbered 0.. (prompts, their samples, no indices)."""
        by_group = self.groups()
        return Round([self.prompts[g] for g in groups],
                     [replace(s, group=i) for i, g in enumerate(groups) for s in by_group[g]])

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


def attach_results(samples: Sequence[Sample], items: Sequence[Any], results: Sequence[Any]) -> None:
    """Store each sample's result (and, when no label was set, its verifier: its reward item's rule verifier)."""
    if len(results) != len(samples):
        raise RuntimeError(f"the verifiers returned {len(results)} results for {len(samples)} responses")
    for s, item, r in zip(samples, items, results):
        s.result = r
        s.verifier = s.verifier or item.verifier


def collate_samples(samples: Sequence[Sample], pad_id: int) -> Batch:
    """The padded training tensors of ``samples`` (``collate_rollout``; tool masks when the rollout had tools)."""
    tools = samples[0].tool_mask is not None if samples else False
    return collate_rollout([s.prompt_ids for s in samples], [s.response_ids for s in samples],
                           [s.rollout_log_probs for s in samples], pad_id,
                           [s.tool_mask for s in samples] if tools else None)
