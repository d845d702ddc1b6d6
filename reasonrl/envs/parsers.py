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
than ``max_call_chars`` is refused unread, and one nested deeper than ``MAX_JSON_DEPTH`` is refused before it is
decoded (``json`` recurses per level: thousands of brackets would raise ``RecursionError``). Finding the calls is one
pass over the turn (``str.find`` forwards only), so a turn of many unclosed tags costs time linear in its length.
Imports neither torch nor ray.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from reasonrl.registry import Registry

from .base import ToolCall

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
MAX_JSON_DEPTH = 32
"""The deepest nesting of arrays and objects a tool call's JSON may have (a real call needs a few levels)."""


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
        bodies, count, unclosed = call_bodies(turn_text, self.max_calls)
        if unclosed:
            out.errors.append("Error: a <tool_call> was never closed with </tool_call>")
        if count > self.max_calls:
            out.errors.append(f"Error: {count} tool calls in one turn; only the first {self.max_calls} ran")
        for body in bodies:
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
        obj, why = load_json(body)
        if why is not None:
            return f"Error: the tool call is not valid JSON ({why[:80]})"
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return 'Error: a tool call must be a JSON object {"name": ..., "arguments": {...}}'
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models write the arguments as a JSON string
            args, why = load_json(args)
            if why is not None:
                return f"Error: the arguments of {obj['name'][:60]!r} are not a JSON object"
        return ToolCall(obj["name"], args if args is not None else {})


def call_bodies(text: str, keep: int):
    """(the texts between the first ``keep`` ``<tool_call>``/``</tool_call>`` pairs, how many pairs there are,
    whether a ``<tool_call>`` after the last pair is never closed). Each search starts where the previous one ended,
    so the whole scan reads ``text`` once, whatever it holds."""
    bodies, count, pos = [], 0, 0
    while True:
        start = text.find(HERMES_OPEN, pos)
        if start < 0:
            return bodies, count, False
        end = text.find(HERMES_CLOSE, start + len(HERMES_OPEN))
        if end < 0:  # no closing tag after this one, so none after any later opening tag either
            return bodies, count, True
        count += 1
        if count <= keep:
            bodies.append(text[start + len(HERMES_OPEN):end])
        pos = end + len(HERMES_CLOSE)


def json_depth(text: str) -> int:
    """The deepest nesting of ``[`` and ``{`` in ``text`` outside JSON strings (one pass, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "[" or ch == "{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == "]" or ch == "}":
            depth -= 1
    return deepest


def load_json(text: str):
    """(the decoded value, None) or (None, why it is refused): not JSON, or nested deeper than ``MAX_JSON_DEPTH``."""
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        return None, f"nested {depth} levels deep, more than {MAX_JSON_DEPTH}"
    try:
        return json.loads(text), None
    except (ValueError, RecursionError) as exc:
        return None, str(exc)


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
