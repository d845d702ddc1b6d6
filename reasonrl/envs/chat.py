"""Tool turns through the chat template, tokenised once; and the drift check.

``ChatTurns`` learns once per tokenizer what its chat template writes between the end of an assistant message and
the start of the next one with a ``tool`` message between (``<|im_end|>\\n<|im_start|>tool\\n`` ... ``<|im_end|>\\n
<|im_start|>assistant\\n`` for ChatML), by rendering a conversation with sentinel texts. A tool turn's tokens are
then that markup's tokens around the observation's own tokens, and the observation is tokenised as plain text
(``encode_observation``: a chat marker inside it never becomes a special token).

The drift check (``ChatTurns.drift``) renders the same conversation with the chat template, tokenises it the way a
trainer that re-tokenises would, and compares it with the tokens the loop trains on: the model's tokens as
generated and the tool turns as tokenised once. A difference is drift (a sampled token sequence that is not the
canonical tokenisation of its text, a template that rewrites earlier turns, a boundary the template tokenises
differently); the loop counts it per trajectory (``env_drift``). Imports neither torch nor ray.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

MODEL_SENTINEL = "MODELTURN7f3a"
TOOL_SENTINEL = "TOOLTURN7f3a"
PROBE = [{"role": "user", "content": "u"}]


def encode_observation(tokenizer: Any, text: str) -> List[int]:
    """Token ids of an environment's output, as *text*: a chat-template marker the output contains
    (``<|im_end|>``, ``<|im_start|>user``) becomes the ordinary tokens of its characters, never the special token, so
    a program cannot forge a turn of the chat. Raises if the tokenizer cannot split special tokens."""
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

    def drift(self, conversation: List[Dict[str, str]], response_ids: List[int]) -> Optional[bool]:
        """Whether ``response_ids`` (what is trained on after the prompt) differ from the chat template's rendering
        of ``conversation`` (the messages after the prompt); None when the template cannot say (no template, or a
        rendering whose prompt part is not the prompt's own)."""
        if not getattr(self.tokenizer, "chat_template", None):
            return None
        try:
            prefix = _ids(self.render(PROBE, True))
            full = _ids(self.render(PROBE + conversation))
        except Exception:  # a template that refuses the conversation cannot be checked against
            return None
        if full[:len(prefix)] != prefix:
            return None
        expected = full[len(prefix):]
        return list(response_ids) != expected[:len(response_ids)]
