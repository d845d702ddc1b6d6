"""The Environment seam: what the multi-turn loop (``reasonrl.rollout.multiturn``) needs from an environment.

One ``Environment`` object per trajectory. ``reset(row)`` gets the dataset row and returns a ``Reset``: extra
messages (shown in the logged conversation; the prompt itself is the row's) and the tools offered as JSON schemas.
Then, each time the model's turn ends at tool calls, ``step(call)`` runs one ``ToolCall`` and returns a
``StepResult``: the observation text (the tool turn), optionally a reward and ``done``. ``close()`` releases what
the trajectory holds; it is called when the trajectory ends, also on errors.

Tools are methods marked with ``@tool(description, parameters)``: ``Environment.step`` checks the call's arguments
against the JSON schema (required keys, no unknown keys, basic types) and calls the method with them, so most
environments only write the methods. An environment that needs shared, costly things (a sandbox pool, an index)
asks its ``EnvContext`` (``context.shared(key, factory)``), which builds them once per loop.
Imports neither torch nor ray.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list,
              "object": dict}


@dataclass
class ToolCall:
    """One parsed call: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Reset:
    """What ``Environment.reset`` returns."""

    tools: List[Dict[str, Any]] = field(default_factory=list)
    """The tools offered, as JSON schemas (``{"type": "function", "function": {name, description, parameters}}``)."""
    messages: List[Dict[str, str]] = field(default_factory=list)
    """Messages the environment adds before the first model turn (logged with the conversation)."""


@dataclass
class StepResult:
    """What one ``Environment.step`` returns."""

    observation: str
    """The text the model sees as the tool's answer."""
    reward: Optional[float] = None
    """A reward from the environment (the last one given is the trajectory's ``env_reward``), or None."""
    done: bool = False
    """The environment ends the trajectory after this step."""
    error: bool = False
    """The call failed (a bad call, an exception in the tool, a limit hit)."""
    timed_out: bool = False
    """The call ran past its time limit (``error`` is also set)."""


class EnvContext:
    """What every environment of one loop shares: the config (the ``tool`` and ``env`` sections, or None) and
    resources built once (``shared``) and closed with the loop."""

    def __init__(self, tool_cfg: Any = None, env_cfg: Any = None) -> None:
        self.tool_cfg, self.env_cfg = tool_cfg, env_cfg
        self._shared: Dict[str, Any] = {}
        self._lock = threading.Lock()

    def shared(self, key: str, factory: Callable[[], Any]) -> Any:
        """The resource under ``key``, built by ``factory()`` on first use (thread-safe)."""
        with self._lock:
            if key not in self._shared:
                self._shared[key] = factory()
            return self._shared[key]

    def close(self) -> None:
        """Close every shared resource that has a ``close`` method."""
        with self._lock:
            items, self._shared = list(self._shared.values()), {}
        for item in items:
            if hasattr(item, "close"):
                item.close()


def tool(description: str, parameters: Optional[Dict[str, Any]] = None) -> Callable:
    """Mark an ``Environment`` method as a tool; ``parameters`` is the JSON schema of its arguments (an object
    schema; default: no arguments). The method takes the arguments as keywords and returns a ``StepResult`` or a
    string (the observation)."""
    schema = parameters or {"type": "object", "properties": {}}

    def mark(method: Callable) -> Callable:
        method.__tool_schema__ = {"type": "function", "function": {
            "name": method.__name__, "description": description, "parameters": schema}}
        return method

    return mark


def check_arguments(schema: Dict[str, Any], arguments: Any) -> Optional[str]:
    """Why ``arguments`` do not fit the object ``schema`` (missing/unknown keys, wrong basic types), or None."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    props = schema.get("properties", {})
    missing = [k for k in schema.get("required", []) if k not in arguments]
    if missing:
        return f"missing argument(s): {', '.join(missing)}"
    unknown = [k for k in arguments if k not in props]
    if unknown:
        return f"unknown argument(s): {', '.join(unknown[:5])}; expected: {', '.join(props) or 'none'}"
    for key, value in arguments.items():
        kind = props[key].get("type")
        want = JSON_TYPES.get(kind)
        if want is not None and (not isinstance(value, want) or (kind != "boolean" and isinstance(value, bool))):
            return f"argument {key!r} must be of type {kind}, got {type(value).__name__}"
    return None


class Environment:
    """Base class: subclass it, mark tool methods with ``@tool``, register it with ``@register_environment``."""

    name = "environment"
    parser = "hermes"
    """The tool-call format the model is asked to use (``reasonrl.envs.parsers``: hermes, fenced_python)."""

    def __init__(self, context: Optional[EnvContext] = None) -> None:
        self.context = context or EnvContext()
        self.row: Dict[str, Any] = {}

    @classmethod
    def declared_tools(cls) -> List[Dict[str, Any]]:
        """The JSON schemas of the class's ``@tool`` methods, in name order (what a row's prompt offers,
        ``reasonrl.envs.prompting``; no instance needed)."""
        found = []
        for attr in sorted(dir(cls)):
            schema = getattr(getattr(cls, attr, None), "__tool_schema__", None)
            if schema is not None:
                found.append(schema)
        return found

    def tools(self) -> List[Dict[str, Any]]:
        """The JSON schemas of the ``@tool`` methods, in name order."""
        return self.declared_tools()

    def reset(self, row: Dict[str, Any]) -> Reset:
        """Start a trajectory for dataset ``row``; the default keeps the row and offers the ``@tool`` methods."""
        self.row = row
        return Reset(tools=self.tools())

    def step(self, call: ToolCall) -> StepResult:
        """Run one call: an unknown tool or arguments that do not fit its schema give an error observation."""
        offered = {t["function"]["name"]: t["function"] for t in self.tools()}
        if call.name not in offered:
            return StepResult(f"Error: unknown tool {call.name[:60]!r}; available: {', '.join(offered) or 'none'}",
                              error=True)
        why = check_arguments(offered[call.name].get("parameters", {}), call.arguments)
        if why is not None:
            return StepResult(f"Error: bad call to {call.name}: {why}", error=True)
        out = getattr(self, call.name)(**call.arguments)
        return out if isinstance(out, StepResult) else StepResult(str(out))

    def close(self) -> None:
        """Release what this trajectory holds (idempotent)."""
