"""Stack dumps of a worker on request: ``faulthandler`` writes every thread's Python stack to a file when the
process gets SIGUSR1. It runs in the signal handler itself (C code), so it works while the worker is stuck in a
call that never returns to Python. The controller's watchdog installs it (``WorkerGroup.enable_stack_dumps``)."""
from __future__ import annotations

import faulthandler
import os
import signal
from typing import Any, Optional, TextIO

DUMP_SIGNAL = signal.SIGUSR1
_dump_file: Optional[TextIO] = None  # kept open: faulthandler writes to its descriptor


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
