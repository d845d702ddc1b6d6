"""Tool sessions (the python tool, several calls sharing state by replay) on both real backends: what one
trajectory leaves in shared memory is not seen by another, and /dev/shm holds at most ``Limits.shm_mb`` whatever
the session's memory limit (the issue: 2 GiB held there under 576 MiB on bwrap).

Docker runs with one warm container here, so the two sessions' calls share it, one after the other.
"""
from __future__ import annotations

import pytest
from components import needs_bwrap, needs_docker

from reasonrl.config.schema import ToolConfig
from reasonrl.sandboxes import Limits
from reasonrl.tools import make_tool

BACKENDS = [
    pytest.param("bwrap", marks=[pytest.mark.bwrap,
                                 needs_bwrap()]),
    pytest.param("docker", marks=[pytest.mark.docker,
                                  needs_docker()]),
]

LEAVE_A_NOTE = ("import os\nopen('/dev/shm/note', 'w').write('from a')\n"
                "fd = os.open('/dev/shm/psm_note', os.O_CREAT | os.O_RDWR, 0o666)\nos.write(fd, b'from a')\n"
                "print(sorted(os.listdir('/dev/shm')))")
LOOK_FOR_NOTES = ("import os\nprint(sorted(os.listdir('/dev/shm')), "
                  "[len(open('/proc/sysvipc/' + t).read().splitlines()) - 1 for t in ('shm', 'sem', 'msg')])")
FILL_DEV_SHM = ("import os\ntotal = 0\nfor i in range(256):\n    try:\n"
                "        with open(f'/dev/shm/fill{i}', 'wb') as f:\n            for _ in range(8):\n"
                "                f.write(b'x' * (1 << 20))\n                total += 1\n    except OSError:\n"
                "        break\nprint(total)")


@pytest.fixture(scope="module")
def tools():
    made = {}

    def get(backend):
        if backend not in made:
            made[backend] = make_tool(ToolConfig(sandbox=backend, timeout_s=5.0, memory_mb=576, concurrency=1))
        return made[backend]

    yield get
    for tool in made.values():
        tool.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_session_does_not_see_what_another_left_in_shared_memory(backend, tools):
    a, b = tools(backend).open_session(), tools(backend).open_session()
    r = a.call(LEAVE_A_NOTE)
    assert not r.error and r.output == "['note', 'psm_note']", r.output  # the note is there, in a's call
    r = b.call(LOOK_FOR_NOTES)
    assert not r.error and r.output == "[] [0, 0, 0]", r.output
    # a's next call replays its cells in a fresh run, so a sees its own note again: state by replay only
    r = a.call("print(open('/dev/shm/note').read())")
    assert not r.error and r.output.endswith("from a"), r.output
    a.close()
    b.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_dev_shm_holds_at_most_its_size_under_any_memory_limit(backend, tools):
    session = tools(backend).open_session()
    r = session.call(FILL_DEV_SHM)
    assert not r.error, r.output
    assert 32 <= int(r.output) <= Limits().shm_mb, r.output  # MiB written before the tmpfs was full
    session.close()
    r = tools(backend).open_session().call(LOOK_FOR_NOTES)
    assert r.output == "[] [0, 0, 0]", r.output
