"""One trajectory of the multi-turn loop (``multiturn.py``): its tokens, tool mask, counters and environment, and
the conversation it amounts to (for the sample log and for the drift check)."""
from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Dict, List, Optional

from reasonrl.envs.chat import encodable

log = logging.getLogger(__name__)


def cut_middle(text: str, keep: int) -> str:
    """``text`` with at most ``keep`` characters: its head and tail around a note when it is longer."""
    if len(text) <= keep:
        return text
    head = keep - keep // 2
    return text[:head] + "\n... (cut: middle left out) ...\n" + text[len(text) - keep // 2:]


class Trajectory:
    """A trajectory in progress: ``ids``/``mask``/``logprobs`` after the prompt, its environment and counters."""

    def __init__(self, prompt: List[int], prefill: List[int], env_name: str) -> None:
        self.prompt = list(prompt)
        self.prefill = prefill  # the prompt's part of the first model turn (e.g. a prefilled "```python\n")
        self.env_name, self.env, self.parser = env_name, None, None
        self.ids: List[int] = []
        self.mask: List[int] = []
        self.logprobs: List[float] = []
        self.observations: List[str] = []  # the text of each tool turn, in order
        self.turn_start = 0  # where the model's text since the last tool turn begins
        self.pending = None  # the ParsedTurn whose calls run before the next model turn
        self.pending_after_eos = False  # that turn ended with the model's EOS
        self.finish: Optional[str] = None
        self.turns = self.calls = self.errors = self.timeouts = self.malformed = 0
        self.seconds = 0.0
        self.per_tool: Counter = Counter()
        self.env_failed = ""
        self.env_reward: Optional[float] = None
        self.step_rewards: List[float] = []  # each step's reward (NaN: none), in order

    def add(self, ids: List[int], tool: bool, logprobs: Optional[List[float]]) -> None:
        self.ids += ids
        self.mask += [int(tool)] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)

    def end(self, reason: str) -> None:
        self.finish = reason
        self.pending = None
        self.close()

    def failed(self, why: str) -> None:
        """The environment broke (raised, hung, would not start): the trajectory ends, its sample is a failure. ``why``
        may quote the model's call: a surrogate in it becomes U+FFFD, so the logs that carry it can encode it."""
        self.env_failed = encodable(why)
        self.parser = None
        if self.turns:
            self.end("env_error")
        else:
            self.close()  # it still gets its first model turn (a response of at least one token), then ends

    def close(self) -> None:
        if self.env is not None:
            try:
                self.env.close()
            except Exception:  # an environment that fails to close must not end the rollout
                log.exception("closing environment %r failed", self.env_name)
            self.env = None

    def runs(self) -> List[tuple]:
        """[(is_tool, token ids)]: the model's and the tool turns' stretches of ``ids``."""
        out: List[tuple] = []
        for tok, m in zip(self.ids, self.mask):
            if out and out[-1][0] == bool(m):
                out[-1][1].append(tok)
            else:
                out.append((bool(m), [tok]))
        return out

    def drift_runs(self) -> List[tuple]:
        """``runs()`` with the prefill joined to the first model turn: the stretches the drift check compares."""
        runs = self.runs()
        if self.prefill:
            if runs and not runs[0][0]:
                runs[0] = (False, list(self.prefill) + runs[0][1])
            else:
                runs.insert(0, (False, list(self.prefill)))
        return runs

    def log_conversation(self, chat: Any) -> List[Dict[str, str]]:
        """The messages after the prompt, as the sample log shows them (the model's text without special tokens)."""
        return self._messages(lambda ids: chat.tokenizer.decode(ids, skip_special_tokens=True))

    def _messages(self, decode) -> List[Dict[str, str]]:
        """Assistant and tool messages in order: each model run decoded by ``decode`` (the prefill joins the first),
        each tool run its observation's text."""
        out, k = [], 0
        for i, (is_tool, ids) in enumerate(self.runs()):
            if is_tool:
                out.append({"role": "tool", "content": self.observations[k] if k < len(self.observations) else ""})
                k += 1
            else:
                out.append({"role": "assistant", "content": decode((self.prefill if i == 0 else []) + ids)})
        return out

    def drift_conversation(self, chat: Any, end_ids: set) -> List[Dict[str, str]]:
        """The conversation as the chat template should render it: with an inline format, one assistant message
        holding everything (the tool's text is part of it); else assistant and tool messages, the model's EOS left
        to the template."""
        def content(ids: List[int]) -> str:
            return chat.decode(ids[:-1] if ids and ids[-1] in end_ids else ids)

        if self.parser is not None and self.parser.inline:
            return [{"role": "assistant", "content": content(self.prefill + self.ids)}]
        return self._messages(content)
