"""A client for the leanprover-community Lean REPL (JSON over stdin/stdout) and a pool of REPL processes.

Protocol (github.com/leanprover-community/repl): each request is one JSON object followed by a blank line,
e.g. ``{"cmd": "import Mathlib"}`` (a fresh environment; only here may ``import`` appear) or
``{"cmd": "theorem ...", "env": 0}`` (run on top of environment 0). Each reply is a JSON object followed by a
blank line: ``{"env": N, "messages": [{"severity", "pos", "endPos", "data"}], "sorries": [...]}`` (empty
lists are left out), or ``{"message": "..."}`` when the REPL refuses the request (e.g. an unknown env).

Processes are started lazily, one per :class:`LeanRepl`, kept per worker process in a module-level pool,
and reused: the environment holding a header's imports is built once per process and reused by every check.
A request that passes its deadline, or a process whose anonymous memory passes its cap, is killed (its whole
process group); the next request starts a fresh process. Imports neither torch nor ray.
"""
from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple


class ReplError(RuntimeError):
    """The REPL could not answer a request (it timed out, crashed, ran out of memory, or was never found)."""

    kind = "error"


class ReplTimeout(ReplError):
    kind = "timeout"


class ReplCrashed(ReplError):
    kind = "crash"


class ReplOutOfMemory(ReplError):
    kind = "memory"


class ReplNotFound(ReplError):
    kind = "not_found"


def find_repl_command() -> Tuple[Optional[List[str]], str]:
    """The default REPL command and how it was found: ``$REASONRL_LEAN_REPL`` (a shell-style command line),
    else ``repl`` on PATH, else ``lake env repl`` when ``lake`` is on PATH. ``(None, why)`` when there is none."""
    import shlex

    configured = os.environ.get("REASONRL_LEAN_REPL")
    if configured:
        return shlex.split(configured), "REASONRL_LEAN_REPL"
    if shutil.which("repl"):
        return [shutil.which("repl")], "repl on PATH"
    if shutil.which("lake"):
        return [shutil.which("lake"), "env", "repl"], "lake env repl (lake on PATH; run from a Lean project with repl)"
    return None, ("no Lean REPL found: set REASONRL_LEAN_REPL or repl_command, or put `repl` (leanprover-community/repl) "
                  "or `lake` on PATH; see docs/lean.md")


def docker_repl_command(image: str = "reasonrl-lean", memory_mb: int = 16384, cpus: float = 1.0,
                        docker: str = "docker") -> List[str]:
    """A ``repl_command`` that runs the REPL in a container of the image built from ``sandboxes/images/lean``:
    no network, a memory cap, read-only root, the REPL as an unprivileged user, stdin kept open (``-i``)."""
    return [docker, "run", "-i", "--rm", "--init", "--network", "none", "--read-only", "--tmpfs", "/tmp:size=512m",
            f"--memory={memory_mb}m", f"--memory-swap={memory_mb}m", f"--cpus={cpus}", "--pids-limit=256",
            "--user", "lean", image, "repl"]


def _die_with_parent() -> None:
    """In the child: ask Linux to SIGKILL it when the worker process that started it dies."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux / no libc: the stdin EOF still ends an idle REPL
        pass


def _process_tree(root: int) -> List[int]:
    """``root`` and all its descendants (found through the parent links in /proc; survives setsid)."""
    children: Dict[int, List[int]] = {}
    try:
        names = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return [root]
    for name in names:
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def _anon_rss_mb(root: int) -> float:
    """Resident anonymous memory (MiB) of ``root`` and its descendants (file-backed pages such as mmapped
    .olean files are not counted: they are shared and reclaimable)."""
    total_kb = 0
    for pid in _process_tree(root):
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        total_kb += int(line.split()[1])
                        break
        except (OSError, ValueError, IndexError):
            continue
    return total_kb / 1024.0


def bwrap_repl_command(command: Sequence[str], ro_paths: Sequence[str] = (), bwrap: str = "bwrap") -> List[str]:
    """Wrap ``command`` in bubblewrap: no network, own pid/ipc/uts namespaces, a private /tmp, only the system
    directories and ``ro_paths`` (e.g. ``~/.elan`` and the Lean project) visible, read-only; dies with its parent."""
    system = ["/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc"]
    # The private /tmp comes first: a path given in ro_paths may live under /tmp and must stay visible.
    binds: List[str] = ["--tmpfs", "/tmp"]
    for path in system + [os.path.abspath(os.path.expanduser(p)) for p in ro_paths]:
        if os.path.exists(path):
            binds += ["--ro-bind", path, path]
    return [bwrap, *binds, "--dev", "/dev", "--proc", "/proc", "--unshare-all",
            "--die-with-parent", "--new-session", "--", *command]


@dataclass
class ReplConfig:
    """How to start and police one REPL process."""

    command: Tuple[str, ...]
    """argv of the REPL (e.g. ``("repl",)``, ``("lake", "env", "repl")`` or a ``docker run -i ...`` line)."""
    cwd: Optional[str] = None
    """Working directory (a Lean project for ``lake env repl``); None: the current one."""
    memory_mb: int = 16384
    """Cap on the anonymous resident memory of the REPL's process tree; passing it kills the REPL."""
    max_commands: int = 400
    """Restart the REPL once it has served this many requests, at the start of the next check (each command
    keeps an environment snapshot in memory)."""
    poll_s: float = 0.2
    """How often the memory cap is checked while waiting for a reply."""
    env: Tuple[Tuple[str, str], ...] = ()
    """Extra environment variables for the REPL process."""


class LeanRepl:
    """One REPL process: send a request, get its reply; knows which header environments it has built."""

    def __init__(self, config: ReplConfig) -> None:
        self.config = config
        self.proc: Optional[subprocess.Popen] = None
        self.header_envs: Dict[str, int] = {}
        self.commands_sent = 0
        self.starts = 0
        """How many processes this REPL slot has started (1 + restarts)."""
        self.noise: List[str] = []
        """The last non-JSON output seen before replies (debug lines of some REPL builds), newest last."""
        self._stderr = None
        self._buffer = b""

    # -- process lifetime -------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the process (if it is not running)."""
        if self.alive:
            return
        self.close()
        exe = self.config.command[0] if self.config.command else ""
        if not exe or (os.sep not in exe and shutil.which(exe) is None) or (os.sep in exe and not os.path.exists(exe)):
            raise ReplNotFound(f"no Lean REPL found: {exe!r} is not an executable")
        self._stderr = tempfile.TemporaryFile()
        env = dict(os.environ, **dict(self.config.env))
        try:
            self.proc = subprocess.Popen(list(self.config.command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._stderr, cwd=self.config.cwd, env=env, start_new_session=True,
                                         preexec_fn=_die_with_parent)
        except OSError as exc:
            raise ReplNotFound(f"no Lean REPL found: cannot start {list(self.config.command)}: {exc}") from None
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.starts += 1
        self._buffer = b""
        self.header_envs = {}
        self.commands_sent = 0

    def kill(self) -> None:
        """Kill the process, its process group and every descendant at once (timeout, crash, memory cap)."""
        if self.proc is not None and self.proc.poll() is None:
            for pid in reversed(_process_tree(self.proc.pid)[1:]):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        """Stop the process (EOF on stdin, then kill) and forget its environments."""
        if self.proc is not None:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()
            except OSError:
                pass
            self.kill()
            for stream in (self.proc.stdout,):
                try:
                    stream.close()
                except Exception:
                    pass
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        self.proc = None
        self.header_envs = {}

    def stderr_tail(self, limit: int = 2000) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - limit))
            return self._stderr.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""

    # -- requests ---------------------------------------------------------------------------------
    def request(self, payload: Dict[str, Any], timeout_s: float) -> Dict[str, Any]:
        """Send one request and return its reply; raises ReplTimeout / ReplCrashed / ReplOutOfMemory (after
        killing the process, so the next request starts a fresh one)."""
        self.start()
        line = json.dumps(payload, ensure_ascii=False)
        try:
            self.proc.stdin.write(line.encode("utf-8") + b"\n\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._crashed("the REPL closed its input") from None
        self.commands_sent += 1
        return self._read_reply(time.monotonic() + timeout_s, timeout_s)

    def _crashed(self, what: str) -> ReplCrashed:
        code = None
        if self.proc:
            try:  # the output ends a moment before the process is reaped: give it a second to report its code
                code = self.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                code = None
        err = self.stderr_tail()
        self.kill()
        self.close()
        return ReplCrashed(f"Lean REPL crashed ({what}; exit code {code}){': ' + err.strip()[-500:] if err.strip() else ''}")

    def _read_reply(self, deadline: float, timeout_s: float) -> Dict[str, Any]:
        """Read until a blank line ends text that parses as one JSON object. Lines before the object that are not
        JSON (debug output of some REPL versions) are kept in ``self.noise`` and skipped."""
        selector = selectors.DefaultSelector()
        selector.register(self.proc.stdout, selectors.EVENT_READ)
        next_mem_check = 0.0
        try:
            while True:
                reply = self._try_parse()
                if reply is not None:
                    return reply
                now = time.monotonic()
                if now >= deadline:
                    self.kill()
                    self.close()
                    raise ReplTimeout(f"Lean REPL timed out after {timeout_s:g}s (killed; it restarts on the next check)")
                if now >= next_mem_check:
                    next_mem_check = now + self.config.poll_s
                    used = _anon_rss_mb(self.proc.pid)
                    if used > self.config.memory_mb:
                        self.kill()
                        self.close()
                        raise ReplOutOfMemory(f"Lean REPL passed its memory cap ({used:.0f} MiB > "
                                              f"{self.config.memory_mb} MiB; killed)")
                events = selector.select(timeout=min(self.config.poll_s, max(0.0, deadline - now)))
                if events:
                    try:
                        chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        reply = self._try_parse(final=True)
                        if reply is not None:
                            return reply
                        raise self._crashed("output ended")
                    self._buffer += chunk
        finally:
            selector.close()

    def _try_parse(self, final: bool = False) -> Optional[Dict[str, Any]]:
        """Parse the first complete reply in the buffer (text up to a blank line), or return None."""
        search_from = 0
        while True:
            cut = self._buffer.find(b"\n\n", search_from)
            if cut < 0:
                if not final or not self._buffer.strip():
                    return None
                cut = len(self._buffer)
            text = self._buffer[:cut].decode("utf-8", "replace")
            for start in _json_starts(text):
                try:
                    reply = json.loads(text[start:])
                except json.JSONDecodeError:
                    continue
                if isinstance(reply, dict):
                    if text[:start].strip():
                        self.noise = (self.noise + [text[:start].strip()[-2000:]])[-20:]
                    self._buffer = self._buffer[cut + 2:]
                    return reply
            if cut >= len(self._buffer):
                return None
            search_from = cut + 2  # a blank line inside noise (or inside a reply still arriving): keep reading

    # -- environments ------------------------------------------------------------------------------
    def header_env(self, header: str, timeout_s: float) -> int:
        """The id of an environment holding ``header`` (imports, options, ``open``s), built once per process.
        Raises ReplError when the header does not elaborate. This is where a REPL that has served
        ``max_commands`` requests is restarted (between checks, so no env id of a running check goes stale)."""
        if self.commands_sent >= self.config.max_commands:
            self.close()
        if header in self.header_envs and self.alive:
            return self.header_envs[header]
        reply = self.request({"cmd": header}, timeout_s)
        errors = [m.get("data", "") for m in reply.get("messages", []) if m.get("severity") == "error"]
        if "env" not in reply or errors:
            detail = "; ".join(errors) or reply.get("message") or json.dumps(reply)[:500]
            raise ReplError(f"the header does not elaborate in this Lean installation: {detail[:1000]}")
        self.header_envs[header] = int(reply["env"])
        return self.header_envs[header]

    def run(self, code: str, env: int, timeout_s: float) -> Dict[str, Any]:
        """Run ``code`` on top of environment ``env``."""
        return self.request({"cmd": code, "env": env}, timeout_s)


def _json_starts(text: str) -> List[int]:
    """Indices of the lines of ``text`` that begin with ``{`` (where the JSON reply may start)."""
    starts = [0] if text.startswith("{") else []
    idx = text.find("\n{")
    while idx >= 0:
        starts.append(idx + 1)
        idx = text.find("\n{", idx + 1)
    return starts


@dataclass
class ReplPool:
    """Up to ``size`` REPL processes in this worker process, handed out one caller at a time.

    ``acquire(header)`` prefers an idle process that already holds ``header``'s environment."""

    config: ReplConfig
    size: int = 1
    _idle: List[LeanRepl] = field(default_factory=list)
    _count: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def acquire(self, header: str = "") -> LeanRepl:
        with self._cond:
            while not self._idle and self._count >= self.size:
                self._cond.wait()
            if self._idle:
                warm = [r for r in self._idle if header in r.header_envs and r.alive]
                repl = (warm or self._idle)[-1]
                self._idle.remove(repl)
                return repl
            self._count += 1
            return LeanRepl(self.config)

    def release(self, repl: LeanRepl) -> None:
        with self._cond:
            self._idle.append(repl)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            for repl in self._idle:
                repl.close()
            self._count -= len(self._idle)
            self._idle.clear()


_POOLS: Dict[Tuple[Any, ...], ReplPool] = {}
_POOLS_LOCK = threading.Lock()


def shared_pool(config: ReplConfig, size: int = 1) -> ReplPool:
    """The pool for ``config`` in this process (verifier instances built in one worker share their REPLs)."""
    key = (config.command, config.cwd, config.memory_mb, config.max_commands, config.env)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = ReplPool(config, size=max(1, size))
        return pool


def close_all_pools() -> None:
    """Stop every REPL process this process started (tests and shutdown)."""
    with _POOLS_LOCK:
        for pool in _POOLS.values():
            pool.close()
        _POOLS.clear()


def messages_of(reply: Dict[str, Any], severity: Optional[str] = None) -> List[Dict[str, Any]]:
    """The reply's messages, optionally only those of one severity ("error", "warning", "info")."""
    msgs = reply.get("messages") or []
    return [m for m in msgs if severity is None or m.get("severity") == severity]


def describe(message: Dict[str, Any], line_offset: int = 0) -> str:
    """``line:col: text`` for a REPL message; ``line_offset`` lines are subtracted (text sent before the code)."""
    pos = message.get("pos") or {}
    line = pos.get("line")
    line = line - line_offset if isinstance(line, int) else "?"
    return f"{line}:{pos.get('column', '?')}: {str(message.get('data', '')).strip()}"


def standin_note(command: Sequence[str]) -> bool:
    """True when ``command`` is this project's test stand-in, not Lean (reported in info so nobody mistakes it)."""
    return any("lean_repl_standin" in part for part in command)
