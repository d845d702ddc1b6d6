"""Tool-call formats: how the model's calls are found in its turn, and how the answers are shown to it.

A parser has ``stop`` (strings that end a model turn at a possible call, for the engine), ``parse(turn_text)``
(the calls at the end of a turn, and the malformed ones as short error texts), and ``inline``: whether the
observation is text inside the assistant's message (``render_inline``) or a ``tool`` message of the chat template.

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, as Qwen-family and many other chat
  templates use. The turn ends at EOS (the model may make several calls in one turn); every call in it runs, and the
  answers come back in one ``tool`` message rendered by the chat template.
- ``fenced_python``: a fenced ```python block, cut by the stop string at its closing fence; the output is shown
  inline as a ```output block (today's Python tool).

Limits (``env`` config): at most ``max_calls_per_turn`` calls run per turn (the rest are one error), a call longer
than ``max_call_chars`` is refused unread. Imports neither torch nor ray.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from reasonrl.registry import Registry

from .base import ToolCall

HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
HERMES_OPEN = "<tool_call>"


@dataclass
class ParsedTurn:
    """The calls found in one model turn."""

    calls: List[ToolCall] = field(default_factory=list)
    """Well-formed calls, in order (at most ``max_calls_per_turn``)."""
    errors: List[str] = field(default_factory=list)
    """One short text per malformed call (bad JSON, no name, too long, too many calls)."""

    @property
    def any(self) -> bool:
        """Whether the turn made a call at all (well-formed or not)."""
        return bool(self.calls or self.errors)


class HermesParser:
    """``<tool_call>{json}</tool_call>`` blocks anywhere in the turn."""

    name = "hermes"
    stop: List[str] = []
    inline = False

    def __init__(self, max_calls_per_turn: int = 8, max_call_chars: int = 8192) -> None:
        self.max_calls, self.max_chars = max_calls_per_turn, max_call_chars

    def parse(self, turn_text: str) -> ParsedTurn:
        """Every call in ``turn_text``; an opening tag never closed counts as one malformed call."""
        out = ParsedTurn()
        matches = HERMES_CALL.findall(turn_text)
        tail = turn_text[turn_text.rfind("</tool_call>") + 1:] if matches else turn_text
        if HERMES_OPEN in tail:
            out.errors.append("Error: a <tool_call> was never closed with </tool_call>")
        if len(matches) > self.max_calls:
            out.errors.append(f"Error: {len(matches)} tool calls in one turn; only the first {self.max_calls} ran")
            matches = matches[:self.max_calls]
        for body in matches:
            call = self.parse_one(body)
            if isinstance(call, str):
                out.errors.append(call)
            else:
                out.calls.append(call)
        return out

    def parse_one(self, body: str):
        """A ``ToolCall`` from the JSON between the tags, or the error text."""
        if len(body) > self.max_chars:
            return f"Error: a tool call of {len(body)} characters is longer than the limit of {self.max_chars}"
        try:
            obj = json.loads(body)
        except ValueError as exc:
            return f"Error: the tool call is not valid JSON ({str(exc)[:80]})"
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return 'Error: a tool call must be a JSON object {"name": ..., "arguments": {...}}'
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except ValueError:
                return f"Error: the arguments of {obj['name'][:60]!r} are not a JSON object"
        return ToolCall(obj["name"], args if args is not None else {})


class ToolFormatParser:
    """A ``reasonrl.tools`` Tool's own format (``fenced_python`` for the python tool): its stop strings, its
    ``find_call`` on the turn's text, its ``render`` of the output, inline in the assistant's message."""

    inline = True

    def __init__(self, tool: Any, argument: str = "code", max_call_chars: int = 8192) -> None:
        self.tool, self.argument, self.max_chars = tool, argument, max_call_chars
        self.name = "fenced_python" if tool.name == "python" else f"tool:{tool.name}"
        self.stop = list(tool.stop)

    def parse(self, turn_text: str) -> ParsedTurn:
        request = self.tool.find_call(turn_text)
        if request is None:
            return ParsedTurn()
        if len(request) > self.max_chars:
            return ParsedTurn(errors=[f"Error: a call of {len(request)} characters is longer than the limit of "
                                      f"{self.max_chars}"])
        return ParsedTurn(calls=[ToolCall(self.tool.name, {self.argument: request})])

    def render_inline(self, observation: str, error: bool = False) -> str:
        """The tool's own rendering of an observation (e.g. a ```output block)."""
        from reasonrl.tools import ToolResult

        return self.tool.render(ToolResult(observation, error=error))


PARSERS = Registry("tool-call parser", config_key="an environment's parser")
"""Parser factories by name: ``(max_calls_per_turn, max_call_chars, tool) -> parser``; ``fenced_python`` wraps the
python tool (``ToolFormatParser``), the others need no tool object."""
PARSERS.register("hermes", lambda calls, chars, tool: HermesParser(max_calls_per_turn=calls, max_call_chars=chars))


@PARSERS.register("fenced_python")
def _fenced_python(calls: int, chars: int, tool: Optional[Any]) -> "ToolFormatParser":
    if tool is None:
        raise ValueError("the fenced_python parser needs the python tool")
    return ToolFormatParser(tool, max_call_chars=chars)


def make_parser(name: str, env_cfg: Any = None, tool: Optional[Any] = None) -> Any:
    """The parser ``name`` with the ``env`` section's limits; ``fenced_python`` wraps the python ``tool``."""
    calls = getattr(env_cfg, "max_calls_per_turn", 8)
    chars = getattr(env_cfg, "max_call_chars", 8192)
    return PARSERS.build(name, calls, chars, tool)


def describe_tools(tools: List[Dict[str, Any]]) -> str:
    """A system-message text that offers ``tools`` in the hermes format, for chat templates without ``tools=``."""
    lines = ["You may call tools. The tools, as JSON schemas:", "<tools>"]
    lines += [json.dumps(t, sort_keys=True) for t in tools]
    lines += ["</tools>", "To call a tool, write on its own line:",
              '<tool_call>{"name": "<tool name>", "arguments": {<arguments as JSON>}}</tool_call>',
              "then end your turn; the answers come back in the next message."]
    return "\n".join(lines)
