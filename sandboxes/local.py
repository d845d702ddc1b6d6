"""The ``subprocess`` backend: a plain child process in a temporary directory, with rlimits and nothing else.

NOT a sandbox: the program runs as the caller's uid and sees the host. It exists as the speed ceiling in
``benchmarks/sandbox.py`` and for trusted code; never point it at model output.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import List, Optional, Sequence, Union

from .base import ExecResult, FileMap, Limits, SandboxError
from .common import (MiB, as_bytes, classify_exit, memfd_with, normalize_files, parent_dirs, read_back_files,
                     read_head, reap, wait_for)


class SubprocessSandbox:
    """Runs the command in a fresh temporary directory; ``python3`` means the current interpreter."""

    name = "subprocess"

    def __init__(self, limits: Optional[Limits] = None) -> None:
        self.limits = limits or Limits()

    def run(self, files: FileMap, command: List[str], limits: Optional[Limits] = None, *,
            stdin: Optional[Union[str, bytes]] = None, read_back: Sequence[str] = ()) -> ExecResult:
        """Run ``command`` in a temporary directory holding ``files``."""
        limits = limits or self.limits
        if not command:
            raise SandboxError("empty command")
        files_b = normalize_files(files)
        work = tempfile.mkdtemp(prefix="reasonrl-subprocess-")
        fds = []
        try:
            for d in parent_dirs(files_b):
                os.makedirs(os.path.join(work, d), exist_ok=True)
            for path, data in files_b.items():
                with open(os.path.join(work, path), "wb") as f:
                    f.write(data)
            argv = [sys.executable if command[0] in ("python3", "python") else command[0], *command[1:]]
            stdin_fd, out_fd, err_fd = memfd_with(as_bytes(stdin)), os.memfd_create("out"), os.memfd_create("err")
            fds = [stdin_fd, out_fd, err_fd]
            start = time.monotonic()
            proc = subprocess.Popen(argv, cwd=work, stdin=stdin_fd, stdout=out_fd, stderr=err_fd,
                                    start_new_session=True, env={"PATH": os.environ.get("PATH", ""), "HOME": work,
                                                                 "TMPDIR": work, "LANG": "C.UTF-8"})
            timed_out = False
            try:
                returncode, cpu = wait_for(proc, limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                returncode, cpu = reap(proc)
            wall = time.monotonic() - start
            stdout, cut_out = read_head(out_fd, limits.output_bytes)
            stderr, cut_err = read_head(err_fd, limits.output_bytes)
            flags = classify_exit(returncode, stderr, cpu, limits.cpu_s)
            return ExecResult(exit_code=returncode, stdout=stdout, stderr=stderr, timed_out=timed_out, wall_s=wall,
                              oom_killed=flags["oom_killed"], pids_limit_hit=flags["pids_limit_hit"],
                              truncated=cut_out or cut_err,
                              files=read_back_files(work, read_back, limits.file_size_mb * MiB) if read_back else {})
        finally:
            for fd in fds:
                os.close(fd)
            shutil.rmtree(work, ignore_errors=True)

    def close(self) -> None:
        """Nothing is held."""
