"""A quiet console: the libraries' own output (Ray, vLLM, transformers: start-up banners, loading, a line per weight
sync) goes to ``<run_dir>/libraries.log``; the console keeps reasonrl's own lines, every error and traceback, and each
known library warning once, with what it means (``KNOWN_WARNINGS``). ``trainer.verbose=true`` leaves the libraries'
output where they put it.

Two ways in: the libraries' Python loggers in this process (``LIBRARY_LOGGERS``: their console handlers are taken
off and this module's handler put on), and the lines of Ray's workers, which Ray's driver prints as they arrive
(``log_to_driver``): the handler Ray registers for them is replaced by ``LibraryOutput.worker_lines``.
"""
from __future__ import annotations

import logging
import re
import sys
import threading
from pathlib import Path
from typing import Callable, Dict, List, Optional, Set, TextIO, Tuple

LIBRARY_LOG = "libraries.log"
LIBRARY_LOGGERS = ("ray", "vllm", "transformers", "torch", "huggingface_hub", "urllib3", "filelock", "datasets")
"""Loggers whose records go to the file (errors also to the console)."""

KNOWN_WARNINGS: Tuple[Tuple[str, str], ...] = (
    ("Token authentication is enabled for this Ray cluster",
     "Ray: the run's local Ray cluster accepts only callers holding the token Ray keeps in ~/.ray/auth_token "
     "(Ray's default); nothing to do"),
    ("Token authentication is disabled for this Ray cluster",
     "Ray: token authentication is off (RAY_AUTH_MODE=disabled), so anyone who can reach this machine's Ray ports "
     "can run code in the cluster; unset RAY_AUTH_MODE on a shared network"),
)
"""(text a library line contains, what it means): printed once per run, the line itself goes to the file."""

_SHOWN = re.compile(r"Traceback \(most recent call last\)|\b(ERROR|CRITICAL|FATAL)\b|^\s*(\w+\.)*\w*(Error|Exception)\b"
                    r"|^(WARNING|ERROR|CRITICAL) reasonrl[.:]|^reasonrl:")
"""A line the console keeps: a traceback's start, an error, an exception's last line, reasonrl's own messages."""
_TRACEBACK_BODY = re.compile(r"^(\s|$)|^During handling|^The above exception")

AUTOSCALER_EVENT = ":event_summary:"
"""The mark of an autoscaler line that is an event (a node added, a demand unmet), not its periodic status."""

_active: Optional["LibraryOutput"] = None


class LibraryOutput:
    """Where the libraries' output goes for one run (``install``); ``close`` puts everything back."""

    def __init__(self, path: Path, console: Optional[TextIO] = None) -> None:
        self.path = path
        self.console = console
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "a", buffering=1)
        self.lock = threading.Lock()
        self.explained: Set[str] = set()
        self.in_traceback: Dict[str, bool] = {}  # per source (a worker's pid): inside a traceback's lines
        self.handler = _FileHandler(self)
        self.taken: List[Tuple[logging.Logger, logging.Handler, int]] = []
        self.propagate: Dict[str, bool] = {}
        self.ray_handler: Optional[Tuple[str, Callable]] = None

    # -------------------------------------------------------------- what reaches the console
    def out(self) -> TextIO:
        return self.console or sys.stderr

    def keep(self, line: str, source: str = "") -> Optional[str]:
        """What the console shows for one library line (None: nothing): the line when it is part of an error or a
        traceback, or reasonrl's own; a known warning's meaning, the first time."""
        for text, meaning in KNOWN_WARNINGS:
            if text in line:
                if text in self.explained:
                    return None
                self.explained.add(text)
                return f"reasonrl: note: {meaning} (the line is in {self.path})"
        if self.in_traceback.get(source):
            if _TRACEBACK_BODY.match(line):
                return line
            self.in_traceback[source] = False  # the exception's own line ends the traceback
            return line
        if "Traceback (most recent call last)" in line:
            self.in_traceback[source] = True
        return line if _SHOWN.search(line) else None

    def write(self, line: str, source: str = "", prefix: str = "") -> None:
        """One library line: into the file, and onto the console when ``keep`` says so."""
        with self.lock:
            self.file.write(prefix + line + "\n")
            shown = self.keep(line, source)
            if shown is not None:
                stream = self.out()
                stream.write((prefix if shown is line else "") + shown + "\n")
                stream.flush()

    # -------------------------------------------------------------- the ways in
    def route_loggers(self) -> None:
        """Take the console handlers off the libraries' loggers and put this module's on (again after a library
        configures its logger anew, e.g. ``ray.init``)."""
        for name in LIBRARY_LOGGERS:
            logger = logging.getLogger(name)
            for index, handler in enumerate(list(logger.handlers)):
                if handler is not self.handler and _writes_to_console(handler):
                    logger.removeHandler(handler)
                    self.taken.append((logger, handler, index))  # its place, to put it back where it was
            if self.handler not in logger.handlers:
                logger.addHandler(self.handler)
            self.propagate.setdefault(name, logger.propagate)
            logger.propagate = False  # the root logger's console handler would print it too

    def route_ray_workers(self) -> None:
        """Ray workers' lines through ``worker_lines`` instead of Ray's printer (after ``ray.init``)."""
        try:
            from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
        except ImportError:  # another Ray release: its lines stay on the console
            return
        with dispatcher._lock:
            for pair in dispatcher.handlers:
                if pair[0] == "ray_print_logs":
                    self.ray_handler = pair
        if self.ray_handler is not None:
            dispatcher.remove_handler("ray_print_logs")
            dispatcher.add_handler("ray_print_logs", self.worker_lines)

    def worker_lines(self, data: dict) -> None:
        """One batch of a Ray worker's output (Ray's dict: lines, pid, actor_name or task_name, is_err)."""
        who = data.get("actor_name") or data.get("task_name") or "worker"
        source = str(data.get("pid", ""))
        lines = data.get("lines", [])
        if source == "autoscaler":  # its status every few seconds; Ray's own printer keeps only its events too
            lines = [line for line in lines if AUTOSCALER_EVENT in line]
        for line in lines:
            self.write(line, source, prefix=f"({who} pid={source}) ")

    def close(self) -> None:
        for logger, handler, index in sorted(self.taken, key=lambda t: t[2]):  # back in their own order and places
            if handler not in logger.handlers:
                logger.handlers.insert(min(index, len(logger.handlers)), handler)
        for name, propagate in self.propagate.items():
            logging.getLogger(name).removeHandler(self.handler)
            logging.getLogger(name).propagate = propagate
        if self.ray_handler is not None:
            from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

            dispatcher.remove_handler("ray_print_logs")
            dispatcher.add_handler(*self.ray_handler)
        self.file.close()


class _FileHandler(logging.Handler):
    def __init__(self, output: LibraryOutput) -> None:
        super().__init__()
        self.output = output
        self.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        text = self.format(record)
        lines = text.splitlines() or [""]
        if record.levelno >= logging.ERROR:  # an error shows whole, whatever its words
            with self.output.lock:
                self.output.file.write(text + "\n")
                self.output.out().write(text + "\n")
                self.output.out().flush()
            return
        for line in lines:
            self.output.write(line, source=f"logger:{record.name}")


def _writes_to_console(handler: logging.Handler) -> bool:
    stream = getattr(handler, "stream", None)
    return not isinstance(handler, logging.FileHandler) and stream in (sys.stdout, sys.stderr, sys.__stdout__,
                                                                       sys.__stderr__)


def install(run_dir: str, verbose: bool, console: Optional[TextIO] = None) -> Optional[LibraryOutput]:
    """Route the libraries' output of this run to ``<run_dir>/libraries.log`` (nothing when ``verbose``)."""
    global _active
    uninstall()
    if verbose:
        return None
    _active = LibraryOutput(Path(run_dir) / LIBRARY_LOG, console)
    _active.route_loggers()
    return _active


def after_ray_start() -> None:
    """Called once Ray runs: its workers' lines, and its loggers again (``ray.init`` sets them up anew)."""
    if _active is not None:
        _active.route_loggers()
        _active.route_ray_workers()


def uninstall() -> None:
    global _active
    if _active is not None:
        _active.close()
        _active = None
