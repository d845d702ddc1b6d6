"""Processes left over by bwrap sandbox runs, told apart from the runs of other processes on a shared machine.

Every bwrap run holds its uid slot (``/run/reasonrl-bwrap/slot-<k>.lock``, flock) from start until its last
process is gone. So a live process of a sandbox user whose slot nobody holds is a leak; one whose slot is held
belongs to a run still going (another test session's, on a machine shared with other users of the sandboxes).
"""
from __future__ import annotations

import fcntl
import os
from typing import Iterable, List

from reasonrl.sandboxes.bwrap import SLOT_DIR, USER_PREFIX, _sandbox_uids


def processes_of(uids: Iterable[int]) -> List[int]:
    """Pids of live (not zombie) processes whose real uid is in ``uids``."""
    uids, found = set(uids), []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status") as f:
                    status = f.read()
            except OSError:
                continue
            uid = int(status.split("\nUid:")[1].split()[0])
            state = status.split("\nState:")[1].split()[0]
            if uid in uids and state != "Z":
                found.append(int(name))
    return found


def leftover_sandbox_processes() -> List[int]:
    """Live processes of the sandbox users whose slot no run holds: taken while holding every free slot's lock,
    so no run can start on those uids during the look."""
    uids = _sandbox_uids(USER_PREFIX)
    held, free = [], []
    try:
        for k, (uid, _) in enumerate(uids):
            try:
                fd = os.open(f"{SLOT_DIR}/slot-{k}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)  # a run holds this slot now
                continue
            held.append(fd)
            free.append(uid)
        return processes_of(free)
    finally:
        for fd in held:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
