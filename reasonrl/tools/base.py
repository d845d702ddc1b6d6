"""The Tool seam: what the multi-turn rollout loop (``reasonrl.rollout.multiturn``) needs from a tool.

A tool says where a model turn ends (``stop`` strings), finds the call at the end of a turn (``find_call``), opens
one session per trajectory (``open_session``) whose ``call`` runs it and never raises, and renders a result as the
text of the tool turn (``render``). The registry is ``registry.py``, ``make_tool`` the package's face
(``reasonrl/tools/__init__.py``). Imports neither torch nor ray.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Protocol, runtime_checkable


@dataclass
class ToolResult:
    """What one tool call gave back."""

    output: str
    """The text shown to the model (already cut to the tool's output limit)."""
    error: bool = False
    """The call failed: an exception, a crash, a limit hit, or the sandbox itself failing."""
    timed_out: bool = False
    """The call ran past its time limit and was stopped (``error`` is also set)."""
    seconds: float = 0.0
    """Wall-clock seconds the call took, sandbox start-up included."""


@runtime_checkable
class ToolSession(Protocol):
    """One trajectory's connection to a tool; state (e.g. interpreter variables) persists across its calls."""

    def call(self, request: str) -> ToolResult:
        """Run one call. Never raises for anything the request does: failures come back as ``ToolResult.error``."""
        ...

    def close(self) -> None:
        """Release what the session holds; called when its trajectory ends, also on errors. Idempotent."""
        ...


@runtime_checkable
class Tool(Protocol):
    """A tool the model can call mid-solution."""

    name: str
    stop: List[str]
    """Strings that end a model turn at a (possible) call: passed to the engine as ``SamplingParams.stop``."""

    def find_call(self, turn_text: str) -> Optional[str]:
        """The call's request if ``turn_text`` (the model's text since the last tool turn) ends with one, else None."""
        ...

    def open_session(self) -> ToolSession:
        ...

    def render(self, result: ToolResult) -> str:
        """The text of the tool turn appended after the call (tokenized once, masked out of the loss)."""
        ...

    def close(self) -> None:
        """Release shared resources (sandbox pools)."""
        ...
