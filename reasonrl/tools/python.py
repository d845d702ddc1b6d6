"""The ``python`` tool: the model writes a fenced ```python block; when the block closes, the code runs in the sandbox
(bwrap or docker, ``reasonrl.sandboxes``) and its output comes back as a ```output block.

State persists by replay: a session keeps the trajectory's earlier cells, and each call runs them again, silently,
in a fresh sandbox before the new cell (``python_runner.py``). So every call gets the backend's full isolation and
limits afresh, nothing of the model's runs between calls (no long-lived process whose CPU time, memory or stray
children could pile up across a trajectory), and tearing a session down cannot leak anything. The price is re-running
earlier cells (at most ``rollout.max_turns - 1`` of them); a cell that timed out, crashed or ended the interpreter is
not replayed (what it did is gone, the earlier cells' state is kept), and a replay that dies in a cell drops that
cell and the later ones (the cells before it are kept). What the call shows and how it ended come from the runner's
supervisor process, in nonce-tagged lines the program cannot write, told by control messages carrying a key the
program's cells never see (``python_runner.py``).
"""
from __future__ import annotations

import json
import re
import secrets
from signal import SIGXCPU
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .base import ToolResult
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
LOST = "what this block did is lost; the variables of the earlier blocks are kept"
RESET = "ToolError: the interpreter state could not be restored and was reset; run your code again"
DROPPED = ("ToolError: block {first} of this session failed when it was run again (it ended, hung or was killed); "
           "it and the {later} blocks after it were dropped, the variables of the {kept} blocks before it are kept; run "
           "your code again")
NO_START = "ToolError: the interpreter could not start; run your code again"


def read_frames(stdout: str, nonce: str) -> Tuple[Optional[float], int, Optional[Dict[str, Any]]]:
    """(replay seconds, the last replayed cell that started or -1, result) from the runner supervisor's nonce-tagged
    lines; None for a line that is missing. Only the supervisor holds the sandbox's stdout and the nonce, so no line
    of the program's can be taken."""
    replayed, started, result = None, -1, None
    for line in stdout.splitlines():
        tag, _, rest = line.partition(" ")
        if tag != nonce:
            continue
        word, _, arg = rest.partition(" ")
        try:
            if word == "replayed":
                replayed = float(arg)
            elif word == "started":
                started = max(started, int(arg))
            elif word == "result":
                result = json.loads(arg)
        except ValueError:
            continue
    return replayed, started, result


class PythonSession:
    """One trajectory's interpreter state: the cells that ran (and how long each took, which bounds its replay)."""

    def __init__(self, tool: "PythonTool") -> None:
        self.tool = tool
        self.cells: List[str] = []
        self.cell_seconds: List[float] = []
        self.closed = False

    def call(self, code: str) -> ToolResult:
        """Run ``code`` after a silent replay of the session's earlier cells; never raises."""
        if self.closed:
            return ToolResult("ToolError: this session is closed", error=True)
        t = self.tool
        timeout = t.timeout_s + 2 * sum(self.cell_seconds) + STARTUP_MARGIN_S
        nonce = secrets.token_hex(16)
        job = json.dumps({"cells": self.cells + [code], "timeout_s": t.timeout_s, "keep_bytes": t.keep_bytes})
        start = time.monotonic()
        try:
            res = t.sandbox.run({"runner.py": RUNNER_SOURCE, "cells.json": job}, ["python3", "-I", "-u", "runner.py"],
                                t.limits(timeout), stdin=nonce + "\n")
        except Exception as exc:  # the sandbox itself failed: the call fails, the trajectory goes on
            return ToolResult(f"ToolError: the sandbox failed ({type(exc).__name__}: {str(exc)[:200]})", error=True,
                              seconds=time.monotonic() - start)
        seconds = time.monotonic() - start
        replayed, started, result = read_frames(res.stdout, nonce)
        if replayed is None or (result is not None and result["status"] == "replay_failed"):
            return self._replay_failed(started, seconds)  # the interpreter died before the new cell started
        if result is None:  # the supervisor itself was stopped: killed by the cell, or the sandbox's hard limit
            if res.timed_out:
                return self._timeout("", seconds)
            why = "it ran out of memory" if res.oom_killed else "the runner was stopped"
            return ToolResult(f"ToolError: the interpreter was killed ({why}); {LOST}", error=True, seconds=seconds)
        shown, dropped = result["head"] + result["tail"], result["dropped"] > 0
        status, code_ = result["status"], result["code"]
        if status == "timeout" or (status == "killed" and code_ == -SIGXCPU):  # wall or CPU (threads) time
            return self._timeout(shown, seconds, dropped)
        if status == "exited":
            return ToolResult(t.cut(shown, f"ToolError: the code ended the interpreter (exit status {code_}); {LOST}",
                                    dropped), error=True, seconds=seconds)
        if status == "killed" or status not in ("ok", "raised"):
            why = "it ran out of memory" if res.oom_killed else f"signal {-code_ if code_ else '?'}"
            return ToolResult(t.cut(shown, f"ToolError: the interpreter was killed ({why}); {LOST}", dropped),
                              error=True, seconds=seconds)
        self.cells.append(code)
        self.cell_seconds.append(min(t.timeout_s, max(0.0, float(result["cell_s"]))))
        return ToolResult(t.cut(shown, truncated=dropped), error=status == "raised", seconds=seconds)

    def _replay_failed(self, started: int, seconds: float) -> ToolResult:
        """The replay died in cell ``started`` (or a later effect of an earlier one showed there): that cell and the
        later ones are dropped, the earlier ones kept; so every such failure shortens the session, and a cell that
        breaks its replay on purpose loses only itself and what came after it. -1: no cell started (the runner
        itself failed): nothing is dropped."""
        if started < 0:
            return ToolResult(NO_START, error=True, seconds=seconds)
        if started >= len(self.cells):  # the runner never names a cell it was not given: nothing to trust
            self.cells, self.cell_seconds = [], []
            return ToolResult(RESET, error=True, seconds=seconds)
        later = len(self.cells) - started - 1
        del self.cells[started:], self.cell_seconds[started:]
        return ToolResult(DROPPED.format(first=started + 1, later=later, kept=started), error=True, seconds=seconds)

    def _timeout(self, shown: str, seconds: float, dropped: bool = False) -> ToolResult:
        note = f"TimeoutError: the code ran longer than {self.tool.timeout_s:g} s and was stopped; {LOST}"
        return ToolResult(self.tool.cut(shown, note, dropped), error=True, timed_out=True, seconds=seconds)

    def close(self) -> None:
        """Forget the cells; later calls are refused."""
        self.closed = True
        self.cells, self.cell_seconds = [], []


_SHARED_BWRAP = None
_SHARED_LOCK = threading.Lock()


def shared_bwrap_sandbox():
    """One bubblewrap backend per process for every python tool: it holds no processes between runs, but it keeps
    one lock file open per sandbox user it has run as, so one per tool would pile those up tool after tool."""
    global _SHARED_BWRAP
    with _SHARED_LOCK:
        if _SHARED_BWRAP is None:
            from reasonrl.sandboxes import get_sandbox

            _SHARED_BWRAP = get_sandbox("bwrap")
        return _SHARED_BWRAP


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
        self._shared = False  # the process-wide bwrap backend: not ours to close

    @property
    def keep_bytes(self) -> int:
        """Bytes of the new cell's output the runner keeps at each end (a character is at most 4 bytes)."""
        return 4 * self.max_output_chars

    @property
    def sandbox(self):
        with self._lock:  # built on first use, in the process that runs the calls
            if self._sandbox is None:
                from reasonrl.sandboxes import Limits, default_backend, get_sandbox

                backend = default_backend() if self._backend == "auto" else self._backend
                if backend == "bwrap":
                    self._sandbox, self._shared = shared_bwrap_sandbox(), True
                else:
                    options = {"limits": Limits(memory_mb=self.memory_mb)}
                    if backend == "docker":
                        options["pool_size"] = self._pool_size
                    self._sandbox = get_sandbox(backend, **options)
            return self._sandbox

    def limits(self, timeout_s: float):
        """The sandbox limits of one call whose whole run may take ``timeout_s``."""
        from reasonrl.sandboxes import Limits

        # the runner's two result lines: the output's head and tail, JSON-escaped (at most 6 bytes a byte)
        return Limits(timeout_s=timeout_s, cpu_s=int(timeout_s) + 1, memory_mb=self.memory_mb,
                      output_bytes=12 * self.keep_bytes + 4096)

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
            if self._sandbox is not None and not self._shared:
                self._sandbox.close()
            self._sandbox, self._shared = None, False
