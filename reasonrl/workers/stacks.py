"""Stack dumps of a worker on request: ``faulthandler`` writes every thread's Python stack to a file when the
process gets SIGUSR1. It runs in the signal handler itself (C code), so it works while the worker is stuck in a
call that never returns to Python. The controller's watchdog installs it (``WorkerGroup.enable_stack_dumps``).

faulthandler needs its file open before the signal comes, so each worker writes into a scratch file outside the run
directory (``scratch_stack_dir``); ``collect_stack_dump`` copies a dump into the run's ``stacks/`` only when one was
asked for, so a run that never hung has no ``stacks/`` folder."""
from __future__ import annotations

import faulthandler
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, TextIO

DUMP_SIGNAL = signal.SIGUSR1
STACK_DUMP_WAIT_S = 5.0
"""How long the controller waits for a signalled worker's stack dump to be written."""
_dump_file: Optional[TextIO] = None  # kept open: faulthandler writes to its descriptor


def scratch_stack_dir() -> Path:
    """A new folder for the workers' open dump files (on the controller's host, outside the run directory)."""
    return Path(tempfile.mkdtemp(prefix="reasonrl-stacks-"))


def install_stack_dump(_instance: Any, path: str) -> int:
    """Register the dump on DUMP_SIGNAL, writing to ``path``; returns this process's pid. Called through Ray's
    ``actor.__ray_call__`` (hence the actor instance first)."""
    global _dump_file
    if _dump_file is not None:
        faulthandler.unregister(DUMP_SIGNAL)
        _dump_file.close()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    _dump_file = open(path, "a")  # append mode: the controller may empty the file before each request
    _dump_file.truncate(0)
    faulthandler.register(DUMP_SIGNAL, file=_dump_file, all_threads=True, chain=False)
    return os.getpid()


def collect_stack_dump(pid: int, scratch: Path, keep: Path) -> str:
    """Signal ``pid`` to dump its stacks into ``scratch`` (its installed file), wait until the file stops growing,
    and keep the text in ``keep`` (its folder made now). Raises OSError when the signal cannot be sent."""
    scratch.write_text("")
    os.kill(pid, DUMP_SIGNAL)
    # faulthandler writes from the worker's signal handler; read once the file has stopped growing.
    deadline, size = time.monotonic() + STACK_DUMP_WAIT_S, -1
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = scratch.stat().st_size
        if now and now == size:
            break
        size = now
    text = scratch.read_text()
    keep.parent.mkdir(parents=True, exist_ok=True)
    keep.write_text(text)
    return text
