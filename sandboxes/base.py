"""The sandbox seam: run untrusted files + a command under limits, get an ExecResult back.

Imports neither torch nor ray. Untrusted code never runs as root on the host, never reaches the
network, and never sees host files that it was not given.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Protocol, Sequence, Union, runtime_checkable


@dataclass
class Limits:
    """Resource limits for one run."""

    timeout_s: float = 10.0
    """Wall-clock limit for the command; the program is killed inside the sandbox when it passes."""
    cpu_s: int = 10
    """CPU-time limit (RLIMIT_CPU) in seconds."""
    memory_mb: int = 512
    """Memory limit in MiB (address space for bwrap, cgroup memory for docker)."""
    pids: int = 64
    """Most processes/threads the program may have at once."""
    file_size_mb: int = 16
    """Largest file the program may write (RLIMIT_FSIZE), in MiB."""
    tmpfs_mb: int = 64
    """Size of the writable work directory (a tmpfs), in MiB."""
    shm_mb: int = 64
    """Size of ``/dev/shm`` (POSIX shared memory, a tmpfs), in MiB. For docker, as ``tmpfs_mb``, the backend's
    own ``limits`` size it once per container."""
    output_bytes: int = 65536
    """stdout and stderr are each truncated to this many bytes."""


@dataclass
class ExecResult:
    """What happened to one command in the sandbox."""

    exit_code: int
    """The command's exit status (negative: killed by that signal; 124/137 conventions are mapped to timed_out)."""
    stdout: str = ""
    """Captured standard output, truncated to ``Limits.output_bytes``."""
    stderr: str = ""
    """Captured standard error, truncated to ``Limits.output_bytes``."""
    timed_out: bool = False
    """True when the wall-clock or CPU-time limit ended the command."""
    wall_s: float = 0.0
    """Seconds from start to end of the command, as measured by the backend."""
    oom_killed: bool = False
    """True when the memory limit was hit."""
    pids_limit_hit: bool = False
    """True when the process limit refused a fork (best effort)."""
    truncated: bool = False
    """True when stdout or stderr was cut."""
    files: Dict[str, bytes] = field(default_factory=dict)
    """Files the caller asked to read back after the run (``Sandbox.run(..., read_back=[...])``)."""


FileMap = Dict[str, Union[str, bytes]]


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program in it): a backend that broke, a bad file map, ..."""


class SandboxUnavailable(SandboxError):
    """The backend cannot run on this machine (missing binary, daemon unreachable, image not built)."""


@runtime_checkable
class Sandbox(Protocol):
    """A place to run untrusted code."""

    name: str

    def run(self, files: FileMap, command: List[str], limits: Limits | None = None, *,
            stdin: Optional[Union[str, bytes]] = None, read_back: Sequence[str] = ()) -> ExecResult:
        """Write ``files`` (relative path -> content) into a fresh work dir, run ``command`` there.

        ``stdin`` is fed to the command's standard input; ``read_back`` names work-dir files whose contents
        (up to ``Limits.file_size_mb``) come back in ``ExecResult.files``. Never raises for anything the
        program does; raises :class:`SandboxError` only when the backend itself fails."""
        ...

    def close(self) -> None:
        """Release containers/processes held by the backend."""
        ...
