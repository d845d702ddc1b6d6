"""Multi-turn rollout with a tool: model turns and tool turns alternate within each trajectory.

Each round, every unfinished trajectory's context (prompt + everything so far) goes to the engine in one batched
``generate`` call, with the tool's stop strings: a model turn ends at a tool call (a closing code fence), at the end
of the answer (EOS), or when the token budget is spent. The calls found at the ends of the turns then run
concurrently in a thread pool, each in its trajectory's own tool session, and each result is appended as a tool turn,
tokenized once. Token in, token out: a trajectory's ``token_ids`` are exactly the tokens the engine produced plus the
tool turns' tokens, never a re-tokenisation of decoded text; ``tool_mask`` marks the tool's tokens, which training
masks out of the loss, the KL and the entropy.

Budgets: ``sampling.max_new_tokens`` bounds the whole trajectory (model and tool tokens: it must fit the same
response width as a single-turn rollout), ``max_turns`` the model turns (so at most ``max_turns - 1`` calls run).
A tool session is closed as soon as its trajectory ends, and every session is closed if anything fails.
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional

from reasonrl.tools import Tool, ToolResult, ToolSession

from .base import Completion, SamplingParams

log = logging.getLogger(__name__)


@dataclass
class ToolCompletion(Completion):
    """A whole trajectory; ``token_ids``/``logprobs`` cover model and tool tokens alike (log-prob 0.0 at tool tokens),
    ``text`` is the model's own text (tool turns left out): what the verifier judges."""

    tool_mask: List[int] = field(default_factory=list)
    """1 at each token a tool turn added, 0 at the model's tokens; as long as ``token_ids``."""
    turns: int = 0
    """Model turns (generate calls) in this trajectory."""
    tool_calls: int = 0
    """Tool calls that ran."""
    tool_errors: int = 0
    """Calls that failed (an exception in the code, a limit hit, a timeout, the sandbox failing)."""
    tool_timeouts: int = 0
    """Calls stopped at their time limit (also counted in ``tool_errors``)."""
    tool_seconds: float = 0.0
    """Wall-clock seconds of this trajectory's calls, summed."""


TOOL_META_KEYS = ("tool_mask", "turns", "tool_calls", "tool_errors", "tool_timeouts", "tool_seconds")
"""Per-row fields a tool rollout adds to the worker's ``generate`` batch (meta)."""


class _Trajectory:
    def __init__(self, prompt: List[int], prefill: List[int]) -> None:
        self.prompt = list(prompt)
        self.prefill = prefill  # the prompt's part of the first model turn (e.g. a prefilled "```python\n")
        self.ids: List[int] = []
        self.mask: List[int] = []
        self.logprobs: List[float] = []
        self.turn_start = 0  # where the model's text since the last tool turn begins
        self.session: Optional[ToolSession] = None
        self.pending: Optional[str] = None  # a call to run before the next model turn
        self.finish: Optional[str] = None
        self.turns = self.calls = self.errors = self.timeouts = 0
        self.seconds = 0.0

    def add(self, ids: List[int], tool: bool, logprobs: Optional[List[float]]) -> None:
        self.ids += ids
        self.mask += [int(tool)] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)

    def end(self, reason: str) -> None:
        self.finish = reason
        self.pending = None
        self.close()

    def close(self) -> None:
        if self.session is not None:
            try:
                self.session.close()
            except Exception:  # a session that fails to close must not end the rollout
                log.exception("closing a tool session failed")
            self.session = None


class ToolRollout:
    """``generate(prompt_token_ids, sampling)`` like a RolloutEngine's, with tool turns inside each sample."""

    def __init__(self, engine: Any, tokenizer: Any, tool: Tool, max_turns: int, concurrency: int = 8) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.engine, self.tokenizer, self.tool = engine, tokenizer, tool
        self.max_turns, self.concurrency = max_turns, max(1, concurrency)

    @classmethod
    def from_config(cls, engine: Any, tokenizer: Any, cfg: Any) -> "ToolRollout":
        """From a whole ``Config``: its ``tool`` section and ``rollout.max_turns``."""
        from reasonrl.tools import make_tool

        return cls(engine, tokenizer, make_tool(cfg.tool), cfg.rollout.max_turns, cfg.tool.concurrency)

    def close(self) -> None:
        self.tool.close()

    def generate(self, prompt_token_ids: List[List[int]], sampling: SamplingParams) -> List[List[ToolCompletion]]:
        if not prompt_token_ids:
            return []
        budget = sampling.max_new_tokens
        self._end_ids = {self.tokenizer.eos_token_id, *sampling.stop_token_ids}
        turn_sampling = replace(sampling, stop=list(self.tool.stop) + list(sampling.stop))
        trajectories: List[_Trajectory] = []
        try:
            first = self.engine.generate(prompt_token_ids, turn_sampling)
            for prompt, completions in zip(prompt_token_ids, first):
                prefill = self._prefill(prompt)
                for c in completions:
                    trajectories.append(_Trajectory(prompt, prefill))
                    self._absorb(trajectories[-1], c, budget)
            rnd = 0
            while True:
                self._run_calls([t for t in trajectories if t.pending is not None], budget)
                active = [t for t in trajectories if t.finish is None]
                if not active:
                    break
                rnd += 1
                room = max(budget - len(t.ids) for t in active)
                seed = None if sampling.seed is None else sampling.seed + rnd
                outs = self.engine.generate([t.prompt + t.ids for t in active],
                                            replace(turn_sampling, n=1, max_new_tokens=room, seed=seed))
                for t, completions in zip(active, outs):
                    self._absorb(t, completions[0], budget)
        finally:
            for t in trajectories:
                t.close()
        n = len(trajectories) // max(1, len(prompt_token_ids))
        done = [self._completion(t, sampling.logprobs) for t in trajectories]
        return [done[i * n:(i + 1) * n] for i in range(len(prompt_token_ids))]

    # ------------------------------------------------------------------ one model turn
    def _absorb(self, t: _Trajectory, c: Completion, budget: int) -> None:
        """Append a model turn and decide what follows: the end, a tool call, or more of the same turn."""
        room = budget - len(t.ids)
        ids = list(c.token_ids[:room])
        t.add(ids, tool=False, logprobs=list(c.logprobs[:room]) if c.logprobs else None)
        t.turns += 1
        if len(c.token_ids) > room or c.finish_reason == "length" or len(t.ids) >= budget:
            return t.end("length")
        if c.finish_reason != "stop" or (ids and ids[-1] in self._end_ids):
            return t.end(c.finish_reason)  # the model ended its answer (EOS or a stop token)
        # Stopped on a stop string: a tool call, unless the fence closed something else.
        text = self.tokenizer.decode((t.prefill if t.turn_start == 0 else []) + t.ids[t.turn_start:],
                                     skip_special_tokens=True)
        call = self.tool.find_call(text)
        if t.turns >= self.max_turns:
            return t.end("max_turns" if call is not None else "stop")
        t.pending = call  # None: the fence was not a call; the model's turn simply goes on next round

    def _prefill(self, prompt: List[int]) -> List[int]:
        """The prompt's tokens after its last special token (the chat template's assistant header): text the answer
        starts with, which belongs to the first model turn. Empty when the prompt has no special token."""
        special = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        for j in range(len(prompt) - 1, -1, -1):
            if prompt[j] in special:
                return list(prompt[j + 1:])
        return []

    # ------------------------------------------------------------------ tool turns
    def _run_calls(self, waiting: List[_Trajectory], budget: int) -> None:
        if not waiting:
            return
        for t in waiting:
            if t.session is None:
                t.session = self.tool.open_session()
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(waiting))) as pool:
            results = list(pool.map(lambda t: self._call(t.session, t.pending), waiting))
        for t, result in zip(waiting, results):
            t.pending = None
            t.calls += 1
            t.errors += int(result.error)
            t.timeouts += int(result.timed_out)
            t.seconds += result.seconds
            ids = encode_observation(self.tokenizer, self.tool.render(result))
            room = budget - len(t.ids)
            t.add(ids[:room], tool=True, logprobs=None)
            t.turn_start = len(t.ids)
            if len(ids) >= room:
                t.end("length")

    @staticmethod
    def _call(session: ToolSession, request: str) -> ToolResult:
        try:
            return session.call(request)
        except Exception as exc:  # a tool that breaks its no-raise contract still must not end the rollout
            log.exception("tool call raised")
            return ToolResult(f"ToolError: {type(exc).__name__}: {exc}", error=True)

    def _completion(self, t: _Trajectory, with_logprobs: bool) -> ToolCompletion:
        model_ids = [i for i, m in zip(t.ids, t.mask) if not m]
        return ToolCompletion(token_ids=list(t.ids), text=self.tokenizer.decode(model_ids, skip_special_tokens=True),
                              logprobs=list(t.logprobs) if with_logprobs else [],
                              finish_reason=t.finish or "stop", tool_mask=list(t.mask), turns=t.turns,
                              tool_calls=t.calls, tool_errors=t.errors, tool_timeouts=t.timeouts,
                              tool_seconds=t.seconds)


def encode_observation(tokenizer: Any, text: str) -> List[int]:
    """Token ids of a tool's (or an environment's) output, as *text*: a chat-template marker the output contains
    (``<|im_end|>``, ``<|im_start|>user``) becomes the ordinary tokens of its characters, never the special token, so a
    program cannot forge a turn of the chat. Raises if the tokenizer cannot split special tokens."""
    ids = list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    special = set(special_token_ids(tokenizer))
    if special.intersection(ids):
        raise ValueError(f"tokenizer {type(tokenizer).__name__} kept special tokens in a tool output although asked "
                         f"to split them (split_special_tokens=True); it cannot be used for tool rollouts")
    return ids


def special_token_ids(tokenizer: Any) -> List[int]:
    """The ids of the tokenizer's special and added tokens (chat markers and the like): the ids text never maps to."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    added = getattr(tokenizer, "get_added_vocab", None)
    if added is not None:
        ids.update(added().values())
    return sorted(ids)


def tool_meta(completions: List[Completion]) -> Dict[str, List[Any]]:
    """The ``TOOL_META_KEYS`` columns of a flat list of trajectories, in order."""
    return {key: [getattr(c, key) for c in completions] for key in TOOL_META_KEYS}
