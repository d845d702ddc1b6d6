"""A seccomp filter for the bwrap backend that takes System V IPC away from the run. Standard library only.

Why: every bwrap run has an IPC namespace of its own, so nothing crosses between runs and everything goes when
the run ends; but inside the run, System V shared memory segments, message queues and semaphore sets are not
charged to any limit the run has (no cgroup; ``RLIMIT_AS`` counts a segment only while it is attached), and the
run may rewrite its namespace's ``kernel.shm*`` / ``kernel.msg*`` / ``kernel.sem`` limits. A run could thus hold
gigabytes of detached segments under a 512 MiB limit. With this filter ``shmget``, ``msgget`` and ``semget`` fail
with ENOSYS (as on a kernel built without System V IPC), so no such object can be created at all. POSIX shared
memory (files in the size-limited ``/dev/shm``) and POSIX message queues (``RLIMIT_MSGQUEUE``) stay usable.

The program is classic BPF as ``bwrap --seccomp FD`` expects it (an array of ``struct sock_filter``): on the
native architecture the three calls get ENOSYS, every other call is allowed; a call made through another ABI
(32-bit x86 ``int 0x80`` and its ``ipc(2)`` multiplexer, x32) kills the process, so no door is left open.
"""
from __future__ import annotations

import errno
import platform
import struct
from typing import Dict, Optional, Tuple

# struct seccomp_data: int nr; __u32 arch; ...
_NR_OFFSET, _ARCH_OFFSET = 0, 4
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15     # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35     # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06     # BPF_RET | BPF_K
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_X32_BIT = 0x40000000

# machine -> (AUDIT_ARCH_*, {name: syscall number})
ARCHES: Dict[str, Tuple[int, Dict[str, int]]] = {
    "x86_64": (0xC000003E, {"shmget": 29, "semget": 64, "msgget": 68}),
    "aarch64": (0xC00000B7, {"shmget": 194, "semget": 190, "msgget": 186}),
}
BLOCKED = ("shmget", "semget", "msgget")


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def sysv_ipc_filter(machine: Optional[str] = None) -> Optional[bytes]:
    """The compiled filter for ``machine`` (default: this one's ``platform.machine()``), or None when there is
    no syscall table for it here (the run then keeps System V IPC; ``docs/verifiers.md`` says so)."""
    arch = ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, numbers = arch
    blocked = [numbers[name] for name in BLOCKED]
    # layout: [0] ld arch  [1] arch? else kill  [2] ld nr  [3] x32? (x86_64 only)  [4..] blocked?  allow  errno  kill
    checks = [_insn(_JGE_K, 0, 0, _X32_BIT)] if audit_arch == ARCHES["x86_64"][0] else []
    checks += [_insn(_JEQ_K, 0, 0, nr) for nr in blocked]
    n = len(checks)
    # offsets are counted from the instruction after the jump; tail = allow (n+0), errno (n+1), kill (n+2)
    program = [_insn(_LD_W_ABS, 0, 0, _ARCH_OFFSET),
               _insn(_JEQ_K, 0, n + 3, audit_arch),  # skip: ld nr, the n checks, allow, errno -> kill
               _insn(_LD_W_ABS, 0, 0, _NR_OFFSET)]
    for i, check in enumerate(checks):
        code, _, _, k = struct.unpack("=HBBI", check)
        to_errno = n - i  # from check i: the remaining checks, then allow, then errno
        to_kill = to_errno + 1
        program.append(_insn(code, to_kill if code == _JGE_K else to_errno, 0, k))
    program += [_insn(_RET_K, 0, 0, _RET_ALLOW),
                _insn(_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
                _insn(_RET_K, 0, 0, _RET_KILL_PROCESS)]
    return b"".join(program)
