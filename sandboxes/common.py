"""Helpers shared by the sandbox backends: file-map checks, output capture, rlimits. Standard library only."""
from __future__ import annotations

import os
import posixpath
import resource
import select
import subprocess
from typing import Dict, List, Sequence, Tuple

from .base import FileMap, Limits, SandboxError

MiB = 1 << 20
MSGQUEUE_BYTES = 512 << 10  # RLIMIT_MSGQUEUE: bytes all POSIX message queues of a run may hold (under the
# kernel default of 800 KiB, so lowering it needs no privilege)


def normalize_files(files: FileMap) -> Dict[str, bytes]:
    """Check that every path is relative and stays inside the work dir; return path -> bytes."""
    out: Dict[str, bytes] = {}
    for path, content in (files or {}).items():
        norm = posixpath.normpath(str(path))
        if not path or norm.startswith(("/", "..")) or norm == "." or "\0" in norm:
            raise SandboxError(f"sandbox file path must be relative and inside the work dir: {path!r}")
        out[norm] = content.encode("utf-8") if isinstance(content, str) else bytes(content)
    return out


def parent_dirs(paths) -> List[str]:
    """All directories that must exist for ``paths`` (relative), parents first."""
    dirs = set()
    for path in paths:
        parent = posixpath.dirname(path)
        while parent:
            dirs.add(parent)
            parent = posixpath.dirname(parent)
    return sorted(dirs, key=lambda d: (d.count("/"), d))


def as_bytes(data) -> bytes:
    """stdin given as str or bytes (or None) -> bytes."""
    if data is None:
        return b""
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def memfd_with(data: bytes, name: str = "reasonrl") -> int:
    """An anonymous in-memory file holding ``data``, positioned at its start (for stdin or bwrap --file)."""
    fd = os.memfd_create(name, 0)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def read_head(fd: int, limit: int) -> Tuple[str, bool]:
    """The first ``limit`` bytes of a file descriptor (from offset 0) as text, and whether more was there."""
    size = os.fstat(fd).st_size
    data = os.pread(fd, min(size, limit), 0) if size else b""
    return data.decode("utf-8", "replace"), size > limit


def msgqueue_bytes() -> int:
    """``MSGQUEUE_BYTES``, or this process's hard limit if that is lower (raising it would need privilege)."""
    hard = resource.getrlimit(resource.RLIMIT_MSGQUEUE)[1]
    return MSGQUEUE_BYTES if hard == resource.RLIM_INFINITY else min(MSGQUEUE_BYTES, hard)


def rlimit_pairs(limits: Limits, nproc: int | None) -> Dict[int, Tuple[int, int]]:
    """The rlimits a sandboxed program runs under (soft, hard)."""
    pairs = {
        resource.RLIMIT_CPU: (int(limits.cpu_s), int(limits.cpu_s) + 1),
        resource.RLIMIT_AS: (limits.memory_mb * MiB, limits.memory_mb * MiB),
        resource.RLIMIT_FSIZE: (limits.file_size_mb * MiB, limits.file_size_mb * MiB),
        resource.RLIMIT_NOFILE: (256, 256),
        resource.RLIMIT_CORE: (0, 0),
        resource.RLIMIT_MSGQUEUE: (msgqueue_bytes(), msgqueue_bytes()),
    }
    if nproc is not None:
        pairs[resource.RLIMIT_NPROC] = (nproc, nproc)
    return pairs


def setpriv_args(uid: int, gid: int) -> List[str]:
    """A ``setpriv`` (util-linux) command prefix that runs the rest as ``uid``:``gid`` with no supplementary groups
    (what ``Popen(user=uid, group=gid, extra_groups=[])`` does, without a step in the child that stops CPython from
    starting it with ``vfork``)."""
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]


def prlimit_args(limits: Limits, nproc: int | None) -> List[str]:
    """The same limits as a ``prlimit`` (util-linux) command prefix, which sets them without a preexec_fn."""
    names = {resource.RLIMIT_CPU: "cpu", resource.RLIMIT_AS: "as", resource.RLIMIT_FSIZE: "fsize",
             resource.RLIMIT_NOFILE: "nofile", resource.RLIMIT_CORE: "core", resource.RLIMIT_NPROC: "nproc",
             resource.RLIMIT_MSGQUEUE: "msgqueue"}
    args = ["prlimit"]
    for key, (soft, hard) in rlimit_pairs(limits, nproc).items():
        args.append(f"--{names[key]}={soft}:{hard}")
    return args + ["--"]


def classify_exit(returncode: int, stderr: str, cpu_s: float = 0.0, cpu_limit_s: float = 0.0) -> Dict[str, bool]:
    """Best-effort flags from how a program ended: CPU limit (SIGXCPU, or SIGKILL at the hard limit once the
    CPU seconds are spent), memory limit, process limit."""
    code = returncode - 128 if returncode > 128 else -returncode
    return {
        "cpu_limit": code == 24 or (code == 9 and cpu_limit_s > 0 and cpu_s >= cpu_limit_s),
        "oom_killed": "MemoryError" in stderr or "Cannot allocate memory" in stderr,
        "pids_limit_hit": "Resource temporarily unavailable" in stderr or "BlockingIOError" in stderr,
    }


def wait_for(proc, timeout):
    """Wait for a Popen child up to ``timeout`` seconds, woken by a pidfd (Popen.wait polls with sleeps of up to
    50 ms); return (exit code as Popen reports it, CPU seconds used by the child and its reaped descendants)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (OSError, AttributeError):
        fd = None
    if fd is not None:
        try:
            if not select.select([fd], [], [], max(0.0, timeout))[0]:
                raise subprocess.TimeoutExpired(proc.args, timeout)
        finally:
            os.close(fd)
    else:
        proc.wait(timeout=timeout)  # the fallback: after this, rusage is no longer available
        return proc.returncode, 0.0
    return reap(proc)


def reap(proc):
    """Reap an exited (or killed) Popen child with wait4; return (exit code, CPU seconds)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def read_back_files(root: str, paths: Sequence[str], limit: int) -> Dict[str, bytes]:
    """Read files the program left, refusing symlinks or anything that resolves outside ``root``."""
    out: Dict[str, bytes] = {}
    real_root = os.path.realpath(root)
    for path in paths:
        full = os.path.join(root, path)
        if os.path.commonpath([os.path.realpath(full), real_root]) != real_root:
            continue
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if os.path.stat.S_ISREG(os.fstat(fd).st_mode):
                out[path] = os.read(fd, limit)
        finally:
            os.close(fd)
    return out
