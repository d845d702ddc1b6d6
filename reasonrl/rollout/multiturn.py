"""Multi-turn rollout in environments: model turns and tool turns alternate within each trajectory.

Each trajectory runs in the environment its dataset row names (``environment`` column; ``env.default`` for rows that
name none; no environment: a plain prompt, one model turn). Each round, every unfinished trajectory's context
(prompt + everything so far) goes to the engine, one batched ``generate`` call per set of stop strings (each
environment's call format has its own, ``reasonrl.envs.parsers``). A model turn ends at a stop string, at EOS, or
when the token budget is spent; the calls it made are parsed, and the trajectories' steps then run concurrently
(``reasonrl.envs.steps``: a thread per trajectory, ``env.step_timeout_s`` per call; with ``env.placement=ray`` each
step is a call to the trajectory's environment actor, ``reasonrl.envs.remote``). Each answer is appended as a tool
turn, tokenized once: inline text (``fenced_python``), or a ``tool`` message in the chat template's own markup
(``hermes``, ``reasonrl.envs.chat``). Token in, token out: a trajectory's ``token_ids`` are exactly the tokens the
engine produced plus the tool turns' tokens, never a re-tokenisation; ``tool_mask`` marks the tool turns, which
training masks out of the loss, the KL and the entropy. With ``env.drift_check`` each trajectory is compared with
the chat template's rendering of its conversation: ``env_drift`` marks a difference at a turn boundary, in a tool
turn or in text, ``env_noncanonical`` one that is only the model's own non-canonical token split (harmless).

Budgets: ``sampling.max_new_tokens`` bounds the whole trajectory (model and tool tokens), ``max_turns`` the model
turns (so at most ``max_turns - 1`` rounds of calls). A malformed call gets an error observation and is counted; an
environment that raises or hangs ends its trajectory with ``env_failed`` set (the trainer marks that sample failed),
never the rollout. Environments are closed as soon as their trajectory ends, and all of them if anything fails.
"""
from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional

from reasonrl.envs import EnvContext, StepResult, make_environment
from reasonrl.envs.chat import BOUNDARY, NONCANONICAL, ChatTurns, encodable
from reasonrl.envs.chat import encode_observation, special_token_ids  # noqa: F401  (re-exported)
from reasonrl.envs.parsers import ParsedTurn, make_parser
from reasonrl.envs.python_env import context_tool
from reasonrl.envs.remote import make_pool
from reasonrl.envs.steps import run_jobs

from .base import Completion, SamplingParams
from .trajectory import Trajectory, cut_middle

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
    """Calls that failed (an error observation: an exception in the code, a bad call, a limit hit, a timeout)."""
    tool_timeouts: int = 0
    """Calls stopped at their time limit (also counted in ``tool_errors``)."""
    tool_seconds: float = 0.0
    """Wall-clock seconds of this trajectory's environment steps, summed."""
    env: str = ""
    """The environment it ran in ("": a plain prompt)."""
    malformed_calls: int = 0
    """Calls that could not be parsed or were over a limit (bad JSON, too long, too many in one turn)."""
    calls_per_tool: Dict[str, int] = field(default_factory=dict)
    """Calls that ran, by tool name."""
    env_failed: str = ""
    """Why the environment failed ("" when it did not): it raised or hung; the sample's reward is a failure."""
    env_reward: float = float("nan")
    """The last reward the environment gave (NaN: none)."""
    step_rewards: List[float] = field(default_factory=list)
    """Each step's reward, in order (NaN for a step that gave none): the environment's own verdicts (code_feedback's
    per submission), which metrics read instead of the observations' text."""
    env_drift: int = -1
    """1: the trained tokens differ from the chat template's rendering of the conversation at a turn boundary, in a
    tool turn or in text (boundary drift, ``reasonrl.envs.chat``); 0: no such difference; -1: unchecked."""
    env_noncanonical: int = -1
    """1: the trained tokens differ from the rendering only because the model's tokens are not the canonical
    tokenisation of their text (harmless: they are trained on as generated); 0: not so; -1: unchecked."""
    conversation: List[Dict[str, str]] = field(default_factory=list)
    """The messages after the prompt (assistant and tool turns), for the sample log."""


TOOL_META_KEYS = ("tool_mask", "turns", "tool_calls", "tool_errors", "tool_timeouts", "tool_seconds", "env",
                  "malformed_calls", "calls_per_tool", "env_failed", "env_reward", "step_rewards", "env_drift",
                  "env_noncanonical", "conversation")
"""Per-row fields a multi-turn rollout adds to the worker's ``generate`` batch (meta)."""


class DriftError(RuntimeError):
    """``env.drift_fatal``: a trajectory's tokens differ from the chat template's rendering of its conversation at a
    turn boundary, in a tool turn or in text (boundary drift; a non-canonical split of the model's text is not)."""


class ToolRollout:
    """``generate(prompt_token_ids, sampling, rows=None)`` like a RolloutEngine's, with environment turns inside each
    sample; ``rows`` are the prompts' dataset rows (the trainer's prompt batch carries them, meta ``rows``), each
    prompt's environment is reset with its own; without them every prompt runs in ``default_env``. ``tool``: the
    loop's tool (the ``python`` environment's); ``default_env``: the environment of rows that name none (None: plain
    prompts)."""

    def __init__(self, engine: Any, tokenizer: Any, tool: Any = None, max_turns: int = 4, concurrency: int = 8,
                 env_cfg: Any = None, default_env: Optional[str] = "python", tool_cfg: Any = None) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.engine, self.tokenizer = engine, tokenizer
        self.max_turns, self.concurrency = max_turns, max(1, concurrency)
        self.env_cfg, self.default_env = env_cfg, default_env or None
        self.context = EnvContext(tool_cfg, env_cfg)
        self.env_pool = make_pool(tool_cfg, env_cfg)  # env.placement=ray: the environments run in Ray actors
        if tool is not None:
            self.context.shared("tool", lambda: tool)
        self.chat = ChatTurns(tokenizer)
        self._parsers: Dict[str, Any] = {}

    @property
    def tool(self) -> Any:
        """The loop's tool (built from the ``tool`` section on first use)."""
        return context_tool(self.context)

    @classmethod
    def from_config(cls, engine: Any, tokenizer: Any, cfg: Any) -> "ToolRollout":
        """From a whole ``Config``: its ``tool`` and ``env`` sections and ``rollout.max_turns``."""
        from reasonrl.config.env_schema import NO_ENVIRONMENT

        default = cfg.tool.name if cfg.env.default is None else cfg.env.default
        return cls(engine, tokenizer, None, cfg.rollout.max_turns, cfg.tool.concurrency, env_cfg=cfg.env,
                   default_env=None if default in (NO_ENVIRONMENT, "") else default, tool_cfg=cfg.tool)

    def close(self) -> None:
        if self.env_pool is not None:
            self.env_pool.close()
        self.context.close()

    def _limit(self, key: str, default: Any) -> Any:
        return getattr(self.env_cfg, key, default) if self.env_cfg is not None else default

    def parser_for(self, env: Any) -> Any:
        if env.parser not in self._parsers:
            tool = self.tool if env.parser == "fenced_python" else None
            self._parsers[env.parser] = make_parser(env.parser, self.env_cfg, tool)
        return self._parsers[env.parser]

    # ------------------------------------------------------------------ the rounds
    def generate(self, prompt_token_ids: List[List[int]], sampling: SamplingParams,
                 rows: Optional[List[Dict[str, Any]]] = None) -> List[List[ToolCompletion]]:
        if not prompt_token_ids:
            return []
        if rows is None:
            rows = [{}] * len(prompt_token_ids)
        if len(rows) != len(prompt_token_ids):
            raise ValueError(f"{len(rows)} dataset rows for {len(prompt_token_ids)} prompts")
        budget = sampling.max_new_tokens
        self._end_ids = {self.tokenizer.eos_token_id, *sampling.stop_token_ids}
        groups: List[List[Trajectory]] = []
        try:
            for prompt, row in zip(prompt_token_ids, rows):
                groups.append([self._start(prompt, row) for _ in range(sampling.n)])
            trajectories = [t for g in groups for t in g]
            self._generate_round([g[0] for g in groups], sampling, budget, first=groups)
            rnd = 0
            while True:
                self._run_steps([t for t in trajectories if t.pending is not None], budget)
                active = [t for t in trajectories if t.finish is None]
                if not active:
                    break
                rnd += 1
                seed = None if sampling.seed is None else sampling.seed + rnd
                self._generate_round(active, replace(sampling, n=1, seed=seed), budget)
        finally:
            for t in (t for g in groups for t in g):
                t.close()
        return [[self._completion(t, sampling.logprobs) for t in g] for g in groups]

    def _start(self, prompt: List[int], row: Dict[str, Any]) -> Trajectory:
        name = (row or {}).get("environment") or self.default_env
        t = Trajectory(prompt, self._prefill(prompt), name or "")
        if name is None:
            return t
        try:
            t.env = self.env_pool.make(name) if self.env_pool is not None else make_environment(name, self.context)
            t.env.reset(row or {})
            t.parser = self.parser_for(t.env)
        except Exception as exc:  # a broken environment fails its trajectories, not the batch
            log.exception("environment %r failed to start", name)
            t.failed(f"environment {name!r} failed to start: {type(exc).__name__}: {str(exc)[:200]}")
        return t

    def _generate_round(self, heads: List[Trajectory], sampling: SamplingParams, budget: int,
                        first: Optional[List[List[Trajectory]]] = None) -> None:
        """One generate call per stop-string set. ``first``: the opening round, ``n`` samples per group head."""
        by_stop: Dict[tuple, List[int]] = {}
        for i, t in enumerate(heads):
            by_stop.setdefault(tuple(t.parser.stop) if t.parser is not None else (), []).append(i)
        for stops, picked in by_stop.items():
            room = budget if first else max(budget - len(heads[i].ids) for i in picked)
            params = replace(sampling, stop=list(stops) + list(sampling.stop), max_new_tokens=room)
            outs = self.engine.generate([heads[i].prompt + heads[i].ids for i in picked], params)
            for i, completions in zip(picked, outs):
                targets = first[i] if first else [heads[i]]
                for t, c in zip(targets, completions):
                    self._absorb(t, c, budget)

    # ------------------------------------------------------------------ one model turn
    def _absorb(self, t: Trajectory, c: Completion, budget: int) -> None:
        """Append a model turn and decide what follows: the end, tool calls, or more of the same turn."""
        room = budget - len(t.ids)
        ids = list(c.token_ids[:room])
        t.add(ids, tool=False, logprobs=list(c.logprobs[:room]) if c.logprobs else None)
        t.turns += 1
        if len(c.token_ids) > room or c.finish_reason == "length" or len(t.ids) >= budget:
            return t.end("length")
        ended = c.finish_reason != "stop" or (ids and ids[-1] in self._end_ids)
        if t.parser is None:  # a plain prompt, or an environment that failed: one turn
            return t.end("env_error" if t.env_failed else c.finish_reason)
        text = self.tokenizer.decode((t.prefill if t.turn_start == 0 else []) + t.ids[t.turn_start:],
                                     skip_special_tokens=True)
        try:
            parsed: ParsedTurn = t.parser.parse(text)
        except Exception as exc:  # a parser that breaks on this turn's text fails this trajectory, not the batch
            log.exception("parsing a turn of environment %r failed", t.env_name)
            return t.failed(f"parsing the model's turn failed: {type(exc).__name__}: {str(exc)[:200]}")
        if not parsed.any:
            if ended or not t.parser.inline:
                return t.end(c.finish_reason)  # the model ended its answer
            if t.turns >= self.max_turns:
                return t.end("stop")
            return None  # stopped on a stop string that was not a call: the turn goes on next round
        if t.turns >= self.max_turns:
            return t.end("max_turns")
        t.pending, t.pending_after_eos = parsed, bool(ids and ids[-1] in self._end_ids)

    def _prefill(self, prompt: List[int]) -> List[int]:
        """Text the answer starts with, already in the prompt (e.g. a prefilled "```python\\n"), which belongs to the
        first model turn: the tokens after the chat template's generation prompt, else after the prompt's last
        special token; empty when there is neither."""
        opener = self.chat.generation_prompt()
        for j in range(len(prompt) - len(opener), -1, -1) if opener else ():
            if prompt[j:j + len(opener)] == opener:
                return list(prompt[j + len(opener):])
        special = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        for j in range(len(prompt) - 1, -1, -1):
            if prompt[j] in special:
                return list(prompt[j + 1:])
        return []

    # ------------------------------------------------------------------ tool turns
    def _run_steps(self, waiting: List[Trajectory], budget: int) -> None:
        if not waiting:
            return
        step_s = float(self._limit("step_timeout_s", 60.0))
        jobs = [(lambda t=t: self._steps(t)) for t in waiting]
        outcomes = run_jobs(jobs, [step_s * max(1, len(t.pending.calls)) for t in waiting], self.concurrency)
        for t, (value, why) in zip(waiting, outcomes):
            parsed, t.pending = t.pending, None
            t.malformed += len(parsed.errors)
            if why is not None:
                t.failed(f"environment {t.env_name!r} step failed: {why}")
                continue
            try:
                self._record(t, parsed, value, budget)
            except Exception as exc:  # this trajectory's answer cannot become a tool turn: it fails, the batch goes on
                log.exception("the tool turn of environment %r failed", t.env_name)
                t.failed(f"environment {t.env_name!r} tool turn failed: {type(exc).__name__}: {str(exc)[:200]}")

    def _record(self, t: Trajectory, parsed: ParsedTurn, value: Any, budget: int) -> None:
        """Count one trajectory's step results and append its tool turn (or end it when the environment is done)."""
        results, seconds = value
        t.seconds += seconds
        texts = list(parsed.errors)
        done = False
        for call, result in zip(parsed.calls, results):
            t.calls += 1
            t.per_tool[encodable(call.name)] += 1
            t.errors += int(result.error)
            t.timeouts += int(result.timed_out)
            if result.reward is not None:
                t.env_reward = float(result.reward)
            t.step_rewards.append(math.nan if result.reward is None else float(result.reward))
            done = done or result.done
            texts.append(self._shown(t, call.name, result, len(parsed.calls) + len(parsed.errors) > 1))
        t.errors += len(parsed.errors)
        if done:
            return t.end("stop")
        self._append_observation(t, texts, budget)

    @staticmethod
    def _steps(t: Trajectory):
        """Run one trajectory's calls in order: (results, seconds)."""
        start = time.monotonic()
        results: List[StepResult] = []
        for call in t.pending.calls:
            results.append(t.env.step(call))
            if results[-1].done:
                break
        return results, time.monotonic() - start

    def _shown(self, t: Trajectory, name: str, result: StepResult, several: bool) -> str:
        text = cut_middle(result.observation or "(no output)", int(self._limit("max_observation_chars", 2048)))
        if t.parser.inline:
            return t.parser.render_inline(text, result.error)
        return f"[{name}] {text}" if several else text

    def _append_observation(self, t: Trajectory, texts: List[str], budget: int) -> None:
        if t.parser.inline:
            observation = encodable("".join(texts))
            ids = encode_observation(self.tokenizer, observation)
        else:
            observation = encodable("\n\n".join(s.strip() for s in texts).strip() or "(no output)")
            ids = self.chat.tool_turn_ids(observation, t.pending_after_eos)
        t.observations.append(observation)
        room = budget - len(t.ids)
        t.add(ids[:room], tool=True, logprobs=None)
        t.turn_start = len(t.ids)
        if len(ids) >= room:
            t.end("length")

    # ------------------------------------------------------------------ the result
    def _completion(self, t: Trajectory, with_logprobs: bool) -> ToolCompletion:
        model_ids = [i for i, m in zip(t.ids, t.mask) if not m]
        conversation = t.log_conversation(self.chat)
        drift = noncanonical = -1
        if t.parser is not None and self._limit("drift_check", True):
            checked = self.chat.drift(t.drift_conversation(self.chat, self._end_ids), t.drift_runs(), self._end_ids)
            if checked is not None:
                drift, noncanonical = int(checked.kind == BOUNDARY), int(checked.kind == NONCANONICAL)
            if drift == 1 and self._limit("drift_fatal", False):
                raise DriftError(f"environment {t.env_name!r}: the trained tokens differ from the chat template's "
                                 f"rendering of the conversation at token {checked.position} (after the prompt, "
                                 f"model turns re-encoded): the template has {list(checked.expected)}, the "
                                 f"trajectory {list(checked.found)}; conversation {conversation!r:.300}")
        return ToolCompletion(token_ids=list(t.ids), text=self.tokenizer.decode(model_ids, skip_special_tokens=True),
                              logprobs=list(t.logprobs) if with_logprobs else [],
                              finish_reason=t.finish or "stop", tool_mask=list(t.mask), turns=t.turns,
                              tool_calls=t.calls, tool_errors=t.errors, tool_timeouts=t.timeouts,
                              tool_seconds=t.seconds, env=t.env_name, malformed_calls=t.malformed,
                              calls_per_tool=dict(t.per_tool), env_failed=t.env_failed,
                              env_reward=t.env_reward if t.env_reward is not None else math.nan,
                              step_rewards=list(t.step_rewards), env_drift=drift,
                              env_noncanonical=noncanonical, conversation=conversation)


def tool_meta(completions: List[Completion]) -> Dict[str, List[Any]]:
    """The ``TOOL_META_KEYS`` columns of a flat list of trajectories, in order."""
    return {key: [getattr(c, key) for c in completions] for key in TOOL_META_KEYS}


__all__ = ["Counter", "DriftError", "TOOL_META_KEYS", "ToolCompletion", "ToolRollout", "encode_observation",
           "special_token_ids", "tool_meta"]
