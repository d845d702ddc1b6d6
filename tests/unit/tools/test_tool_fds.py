"""The trainer process's open file descriptors stay flat over hundreds of tool sessions, across tools made and
closed again (as a trainer and its evaluation each make theirs)."""
from __future__ import annotations

import os

import pytest
from components import needs_bwrap, needs_docker

from reasonrl.config.schema import ToolConfig
from reasonrl.tools import make_tool
from reasonrl.tools.python import shared_bwrap_sandbox

SLOT_LOCK = "/run/reasonrl-bwrap/slot-"  # the bwrap backend's lock file per sandbox user, opened once and kept
SHAPE = {"bwrap": (2, 100), "docker": (2, 30)}  # tools made one after the other, sessions of a trivial cell each


def open_fds():
    """{fd: what it points at} of this process (the descriptor listdir itself opens is gone when readlink runs)."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except FileNotFoundError:
            pass
    return out


@pytest.mark.parametrize("backend", [
    pytest.param("bwrap", marks=needs_bwrap()),
    pytest.param("docker", marks=needs_docker()),
])
def test_fd_count_stays_flat_over_hundreds_of_sessions(backend):
    def without_locks(fds):
        return sorted(path for path in fds.values() if not path.startswith(SLOT_LOCK))

    tools, sessions = SHAPE[backend]  # 200 on bwrap, the cheapest backend; docker's pool start-up costs more
    before = open_fds()
    for _ in range(tools):
        tool = make_tool(ToolConfig(sandbox=backend, concurrency=2))
        try:
            for i in range(sessions):
                s = tool.open_session()
                r = s.call(f"print({i})")
                assert r.output == str(i) and not r.error, r
                s.close()
                if i == 0:
                    warm = open_fds()  # the backend's own connections (docker's attached containers) are open now
            assert without_locks(open_fds()) == without_locks(warm)  # the later sessions left nothing open
        finally:
            tool.close()
    if backend == "docker":
        return  # a closed DockerSandbox still holds its Docker client's sockets (sandboxes/docker_pool.py)
    after = open_fds()
    assert without_locks(after) == without_locks(before), (before, after)
    # the bwrap backend keeps one lock file per sandbox user it ran as, once per process (one backend per tool would
    # hold up to that many per tool made: 100 sessions spread at random over 16 users touch nearly all of them)
    users = len(shared_bwrap_sandbox().slots.uids) if shared_bwrap_sandbox().slots else 0
    locks = [fd for fd, path in after.items() if path.startswith(SLOT_LOCK) and fd not in before]
    assert len(locks) <= users, locks
