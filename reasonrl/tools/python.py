"""The ``python`` tool: the model writes a fenced ```python block; when the block closes, the code runs in the sandbox
(bwrap or docker, ``reasonrl.sandboxes``) and its output comes back as a ```output block.

State persists by replay: a session keeps the trajectory's earlier cells, and each call runs them again, silently,
in a fresh sandbox before the new cell (``python_runner.py``). So every call gets the backend's full isolation and
limits afresh, nothing of the model's runs between calls (no long-lived process whose CPU time, memory or stray
children could pile up across a trajectory), and tearing a session down cannot leak anything. The price is re-running
earlier cells (at most ``rollout.max_turns - 1`` of them); a cell that timed out or crashed the interpreter is not
replayed (its state is gone, as it would be in a notebook whose kernel died).
"""
from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any, List, Optional

from .base import ToolResult
from .python_runner import EXIT_RAISED, EXIT_TIMEOUT, MARKER
from .registry import register_tool

RUNNER_SOURCE = (Path(__file__).resolve().parent / "python_runner.py").read_text()
CALL = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n(.*?)\n?[ \t]*```\s*\Z", re.DOTALL)
OUTPUT_OPEN, OUTPUT_CLOSE = "```output\n", "\n```\n"
STARTUP_MARGIN_S = 2.0  # interpreter start-up (and a busy machine) on top of the cells' own time
SYSTEM_PROMPT = (
    "You can run Python code while you solve the problem. Write code in a block that starts with ```python and "
    "ends with ```; when the block closes, the code runs and what it prints is shown to you in a block that starts "
    "with ```output. Variables and functions persist between your blocks. Only the Python standard library is "
    "available (math, fractions, itertools, ...). Use print() to see values. Example:\n"
    "```python\nprint(17 * 23)\n```\n```output\n391\n```\n"
    "When you are done, put the final answer within \\boxed{}.")
"""The system message of ``task=math_tool``: how to call the tool, and the answer format the verifier reads."""


class PythonSession:
    """One trajectory's interpreter state: the cells that ran (and how long each took, which bounds its replay)."""

    def __init__(self, tool: "PythonTool") -> None:
        self.tool = tool
        self.cells: List[str] = []
        self.cell_seconds: List[float] = []
        self.closed = False

    def call(self, code: str) -> ToolResult:
        if self.closed:
            return ToolResult("ToolError: this session is closed", error=True)
        t = self.tool
        replay_s = sum(self.cell_seconds)
        timeout = t.timeout_s + 2 * replay_s + STARTUP_MARGIN_S
        limits = t.limits(timeout)
        job = json.dumps({"cells": self.cells + [code], "timeout_s": t.timeout_s})
        start = time.monotonic()
        try:
            res = t.sandbox.run({"runner.py": RUNNER_SOURCE, "cells.json": job}, ["python3", "-I", "-u", "runner.py"],
                                limits)
        except Exception as exc:  # the sandbox itself failed: the call fails, the trajectory goes on
            return ToolResult(f"ToolError: the sandbox failed ({type(exc).__name__}: {str(exc)[:200]})", error=True,
                              seconds=time.monotonic() - start)
        seconds = time.monotonic() - start
        head, _, shown = res.stdout.partition("\n")
        replayed = head.startswith(MARKER + " ")
        if not replayed:  # the interpreter died before the new cell started: an earlier cell ends it on replay
            self.cells, self.cell_seconds = [], []
            return ToolResult(t.cut(res.stdout + res.stderr, "ToolError: the interpreter state could not be restored "
                                    "and was reset; run your code again", res.truncated), error=True, seconds=seconds)
        try:
            replayed_s = float(head.split()[1])
        except (IndexError, ValueError):
            replayed_s = replay_s
        timed_out = res.timed_out or res.exit_code == EXIT_TIMEOUT
        if timed_out:
            return ToolResult(t.cut(shown, f"TimeoutError: the code ran longer than {t.timeout_s:g} s and was stopped; "
                                    f"its variables are lost", res.truncated), error=True, timed_out=True,
                              seconds=seconds)
        if res.exit_code not in (0, EXIT_RAISED):  # killed: memory, process limit, a signal
            why = "it ran out of memory" if res.oom_killed else f"exit status {res.exit_code}"
            return ToolResult(t.cut(shown, f"ToolError: the interpreter was killed ({why}); its variables are lost",
                                    res.truncated), error=True, seconds=seconds)
        self.cells.append(code)
        self.cell_seconds.append(min(t.timeout_s, max(0.0, res.wall_s - replayed_s)))
        return ToolResult(t.cut(shown, truncated=res.truncated), error=res.exit_code == EXIT_RAISED, seconds=seconds)

    def close(self) -> None:
        self.closed = True
        self.cells, self.cell_seconds = [], []


@register_tool("python")
class PythonTool:
    """Python in the sandbox; ``cfg`` is the ``tool`` config section (``reasonrl.config.schema.ToolConfig``)."""

    name = "python"
    stop = ["```\n"]  # a closing fence; an opening ```python does not match (the line goes on after the ticks)

    def __init__(self, cfg: Any, sandbox=None) -> None:
        self.timeout_s = float(cfg.timeout_s)
        self.memory_mb = int(cfg.memory_mb)
        self.max_output_chars = int(cfg.max_output_chars)
        self._sandbox = sandbox
        self._backend = cfg.sandbox
        self._pool_size = int(cfg.concurrency)
        self._lock = threading.Lock()

    @property
    def sandbox(self):
        with self._lock:  # built on first use, in the process that runs the calls
            if self._sandbox is None:
                from reasonrl.sandboxes import Limits, get_sandbox

                options = {"limits": Limits(memory_mb=self.memory_mb)}
                if self._backend == "docker":
                    options["pool_size"] = self._pool_size
                self._sandbox = get_sandbox(self._backend, **options)
            return self._sandbox

    def limits(self, timeout_s: float):
        from reasonrl.sandboxes import Limits

        return Limits(timeout_s=timeout_s, cpu_s=int(timeout_s) + 1, memory_mb=self.memory_mb,
                      output_bytes=max(4096, 4 * self.max_output_chars + len(MARKER) + 32))

    def cut(self, text: str, note: str = "", truncated: bool = False) -> str:
        """At most ``max_output_chars`` of ``text``: its head and its tail (where an error's last line is), with a
        note between them when something was left out (``truncated``: the sandbox already cut the stream); then
        ``note`` on its own line."""
        text, keep = text.rstrip("\n"), self.max_output_chars
        if len(text) > keep:
            head = keep - keep // 2
            text = text[:head] + "\n... (output cut: middle left out) ...\n" + text[len(text) - keep // 2:]
        elif truncated:
            text += "\n... (output cut)"
        return "\n".join(part for part in (text, note) if part)

    def find_call(self, turn_text: str) -> Optional[str]:
        """The code of a ```python block that closes at the very end of ``turn_text`` (trailing blanks allowed)."""
        opening = max(turn_text.rfind("```python"), turn_text.rfind("```py"))
        if opening < 0:
            return None
        match = CALL.match(turn_text, opening)
        return match.group(1) if match and match.group(1).strip() else None

    def open_session(self) -> PythonSession:
        return PythonSession(self)

    def render(self, result: ToolResult) -> str:
        return OUTPUT_OPEN + (result.output or "(no output)") + OUTPUT_CLOSE

    def close(self) -> None:
        with self._lock:
            if self._sandbox is not None:
                self._sandbox.close()
                self._sandbox = None
