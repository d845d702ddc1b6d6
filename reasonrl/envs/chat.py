"""Tool turns through the chat template, tokenised once; and the drift check.

``ChatTurns`` learns once per tokenizer what its chat template writes between the end of an assistant message and
the start of the next one with a ``tool`` message between (``<|im_end|>\\n<|im_start|>tool\\n`` ... ``<|im_end|>\\n
<|im_start|>assistant\\n`` for ChatML), by rendering a conversation with sentinel texts. A tool turn's tokens are
then that markup's tokens around the observation's own tokens, and the observation is tokenised as plain text
(``encode_observation``: a chat marker inside it never becomes a special token).

The drift check (``ChatTurns.drift``) renders the same conversation with the chat template, tokenises it the way a
trainer that re-tokenises would, and compares it with the tokens the loop trains on: the model's tokens as
generated and the tool turns as tokenised once. It tells two kinds of difference apart (``Drift.kind``):

- ``noncanonical``: only the model's own segmentation differs. A sampled token sequence need not be the canonical
  tokenisation of its text (BPE is not a bijection: the model may sample " Cor" "al" "ia" where encoding the text
  gives " Cor" "alia"); re-encoding each model turn's text makes the trajectory match the rendering everywhere.
  Harmless here: the loop trains on the tokens as generated.
- ``boundary``: the rendering differs even then: at a turn boundary (a separator dropped or added, another end
  token), in a tool turn's tokens, or in the text (a template that rewrites or strips a turn, a chat marker in a tool
  output that the template makes special). What a bug in the loop or the template looks like.

Imports neither torch nor ray.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

MODEL_SENTINEL = "MODELTURN7f3a"
TOOL_SENTINEL = "TOOLTURN7f3a"
PROBE = [{"role": "user", "content": "u"}]
IDENTICAL, NONCANONICAL, BOUNDARY = "identical", "noncanonical", "boundary"
SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Drift:
    """The drift check's verdict on one trajectory."""

    kind: str
    """``identical``, ``noncanonical`` (the model's tokens are not the canonical tokenisation of its text, all else
    matches) or ``boundary`` (the rendering differs at a turn boundary, in a tool turn or in text)."""
    position: int = -1
    """The first differing token: in the trained tokens for ``noncanonical``, in the trained tokens with each model
    turn re-encoded for ``boundary``; -1 when identical."""
    expected: Tuple[int, ...] = ()
    """For ``boundary``: a few of the template's tokens from ``position`` on (for the error message)."""
    found: Tuple[int, ...] = ()
    """For ``boundary``: the (re-encoded) trajectory's tokens from ``position`` on."""


def first_difference(ids: Sequence[int], expected: Sequence[int]) -> Optional[int]:
    """The first position where ``ids`` differ from ``expected`` (``ids`` may stop early: a trajectory cut at its
    budget is a prefix of its rendering); None when ``ids`` is a prefix of ``expected``."""
    for i, (a, b) in enumerate(zip(ids, expected)):
        if a != b:
            return i
    return None if len(ids) <= len(expected) else len(expected)


def encodable(text: str) -> str:
    """``text`` with every surrogate code point (a lone ``\\ud800`` from a tool call's JSON escapes, which UTF-8
    cannot encode and a tokenizer refuses) replaced by U+FFFD."""
    return SURROGATE.sub("\ufffd", text)


def encode_observation(tokenizer: Any, text: str) -> List[int]:
    """Token ids of an environment's output, as *text*: a chat-template marker the output contains
    (``<|im_end|>``, ``<|im_start|>user``) becomes the ordinary tokens of its characters, never the special token, so
    a program cannot forge a turn of the chat; a surrogate becomes U+FFFD (``encodable``). Raises if the tokenizer
    cannot split special tokens."""
    ids = list(tokenizer(encodable(text), add_special_tokens=False, split_special_tokens=True)["input_ids"])
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


def _ids(rendered: Any) -> List[int]:
    if isinstance(rendered, dict) or hasattr(rendered, "input_ids"):  # BatchEncoding in newer transformers
        rendered = rendered["input_ids"]
    return list(rendered)


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template reads a ``tools`` variable (then tools are rendered with ``tools=``)."""
    return "tools" in (getattr(tokenizer, "chat_template", None) or "")


class ChatTurns:
    """A tokenizer's tool-turn markup, and the drift check against its chat template."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_token_id
        self._markup: Optional[Tuple[List[int], List[int]]] = None

    def render(self, messages: List[Dict[str, str]], generation_prompt: bool = False, tokenize: bool = True):
        return self.tokenizer.apply_chat_template(messages, tokenize=tokenize, add_generation_prompt=generation_prompt)

    def markup(self) -> Tuple[List[int], List[int]]:
        """(tokens before the observation, tokens after it) of a tool message following an assistant message."""
        if self._markup is None:
            if not getattr(self.tokenizer, "chat_template", None):
                raise ValueError("the tokenizer has no chat template: tool messages cannot be rendered (use an "
                                 "environment with an inline format such as fenced_python)")
            text = self.render(PROBE + [{"role": "assistant", "content": MODEL_SENTINEL},
                                        {"role": "tool", "content": TOOL_SENTINEL}], True, tokenize=False)
            start = text.find(MODEL_SENTINEL)
            if start < 0 or TOOL_SENTINEL not in text[start:]:
                raise ValueError("the chat template does not render a 'tool' message")
            before, _, after = text[start + len(MODEL_SENTINEL):].partition(TOOL_SENTINEL)
            enc = lambda s: list(self.tokenizer(s, add_special_tokens=False)["input_ids"])  # noqa: E731
            self._markup = (enc(before), enc(after))
        return self._markup

    def generation_prompt(self) -> List[int]:
        """The tokens the template appends for ``add_generation_prompt`` (``<|im_start|>assistant\\n``); [] if none."""
        if not hasattr(self, "_generation_prompt"):
            try:
                bare, opened = _ids(self.render(PROBE)), _ids(self.render(PROBE, True))
                self._generation_prompt = opened[len(bare):] if opened[:len(bare)] == bare else []
            except Exception:  # no template, or one that cannot render the probe
                self._generation_prompt = []
        return self._generation_prompt

    def tool_turn_ids(self, observation: str, model_ended_with_eos: bool) -> List[int]:
        """The tokens of one tool message after a model turn (the model's EOS, when it wrote one, is the markup's
        first token and is not repeated)."""
        before, after = self.markup()
        if model_ended_with_eos and before[:1] == [self.eos]:
            before = before[1:]
        return before + encode_observation(self.tokenizer, observation) + after

    def decode(self, ids: List[int]) -> str:
        """Text of model tokens as the template would be given it back (special tokens kept, no clean-up)."""
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def rendered(self, conversation: List[Dict[str, str]]) -> Optional[List[int]]:
        """The template's tokens for ``conversation`` after the probe prompt's generation prompt; None when the
        template cannot say (no template, one that refuses the conversation, or a rendering whose prompt part is not
        the prompt's own)."""
        if not getattr(self.tokenizer, "chat_template", None):
            return None
        try:
            if not hasattr(self, "_probe_prefix"):
                self._probe_prefix = _ids(self.render(PROBE, True))
            prefix = self._probe_prefix
            full = _ids(self.render(PROBE + conversation))
        except Exception:  # a template that refuses the conversation cannot be checked against
            return None
        return full[len(prefix):] if full[:len(prefix)] == prefix else None

    def drift(self, conversation: List[Dict[str, str]], runs: Iterable[Tuple[bool, List[int]]],
              end_ids: Iterable[int] = ()) -> Optional[Drift]:
        """How the trained tokens (``runs``: the trajectory's model and tool stretches, ``(is_tool, ids)`` in
        order, the prefill joined to the first model turn) differ from the template's rendering of
        ``conversation`` (the messages after the prompt); None when the template cannot say. A model turn's
        closing token (one of ``end_ids``) is kept as it is; the text before it is re-encoded only when the trained
        tokens differ, so a trajectory that matches costs one rendering."""
        runs = [(bool(tool), list(ids)) for tool, ids in runs]
        expected = self.rendered(conversation)
        if expected is None:
            return None
        at = first_difference([t for _, ids in runs for t in ids], expected)
        if at is None:
            return Drift(IDENTICAL)
        ends, canonical = set(end_ids), []
        for tool, ids in runs:
            if tool:
                canonical += ids
                continue
            body, end = (ids[:-1], ids[-1:]) if ids and ids[-1] in ends else (ids, [])
            canonical += list(self.tokenizer(self.decode(body), add_special_tokens=False)["input_ids"]) + end
        boundary = first_difference(canonical, expected)
        if boundary is None:
            return Drift(NONCANONICAL, at)
        return Drift(BOUNDARY, boundary, tuple(expected[boundary:boundary + 8]),
                     tuple(canonical[boundary:boundary + 8]))
