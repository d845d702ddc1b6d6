"""The python tool on both sandbox backends: state persists across a session's calls, failures come back as error
messages (never exceptions), and hostile cells end only their own call: the host is untouched and the next call of
the same session still works with its earlier state."""
from __future__ import annotations

import os
import secrets

import pytest
from components import needs_bwrap, needs_docker

from reasonrl.config.schema import ToolConfig
from reasonrl.tools import ToolResult, make_tool
from reasonrl.tools.python import PythonTool

BACKENDS = [
    pytest.param("bwrap", marks=needs_bwrap()),
    pytest.param("docker", marks=needs_docker()),
]
TOKEN = secrets.token_hex(8)  # the secret's content; its path carries another name
SECRET = f"/root/reasonrl_tool_attack_{secrets.token_hex(8)}"
WRITE_TARGETS = [f"/tmp/reasonrl_tool_pwned_{TOKEN}", f"/root/reasonrl_tool_pwned_{TOKEN}",
                 f"/etc/reasonrl_tool_pwned_{TOKEN}"]


@pytest.fixture(scope="module")
def tools():
    made = {}

    def get(backend):
        if backend not in made:
            made[backend] = make_tool(ToolConfig(sandbox=backend, timeout_s=2.0, memory_mb=256, max_output_chars=200))
        return made[backend]

    yield get
    for tool in made.values():
        tool.close()


@pytest.fixture(scope="module", autouse=True)
def host_secret():
    with open(SECRET, "w") as f:
        f.write(TOKEN)
    os.chmod(SECRET, 0o600)
    yield
    for path in [SECRET] + WRITE_TARGETS:
        if os.path.exists(path):
            os.unlink(path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_persists_across_calls_and_errors_are_messages(backend, tools):
    s = tools(backend).open_session()
    try:
        r = s.call("x = 6 * 7\nprint(x)")
        assert r.output == "42" and not r.error and r.seconds > 0
        r = s.call("def double(n):\n    return 2 * n\ndouble(x)")  # the last expression is shown, as in a notebook
        assert r.output == "84" and not r.error
        r = s.call("y = x + 1\n1 / 0")
        assert r.error and not r.timed_out and "ZeroDivisionError" in r.output and '"<cell 2>", line 2' in r.output
        assert "runner" not in r.output  # the traceback starts in the model's cell
        r = s.call("print(y, double(y))")  # a cell that raised keeps what it did before raising
        assert r.output == "43 86" and not r.error
        drawn = s.call("import random\nr = random.random()\nprint(r)").output
        assert s.call("print(r)").output == drawn  # the replay draws the same number (random is seeded)
        r = s.call("print(undefined_name)")
        assert r.error and "NameError" in r.output
        r = s.call("syntax error here")
        assert r.error and "SyntaxError" in r.output
    finally:
        s.close()
    assert s.call("print(1)").error  # a closed session refuses calls instead of running them


@pytest.mark.parametrize("backend", BACKENDS)
def test_sessions_do_not_share_state(backend, tools):
    a, b = tools(backend).open_session(), tools(backend).open_session()
    assert not a.call("secret = 5").error
    r = b.call("print(secret)")
    assert r.error and "NameError" in r.output
    assert a.call("print(secret)").output == "5"


ATTACKS = {
    # name: (cell, what the tool turn must say, whether it is a timeout)
    "infinite_loop": ("while True:\n    pass", "TimeoutError", True),
    "loop_that_swallows_the_timer": ("while True:\n    try:\n        while True:\n            pass\n"
                                     "    except BaseException:\n        pass", "TimeoutError", True),
    "sleep_past_the_limit": ("import time\ntime.sleep(600)", "TimeoutError", True),
    "fork_bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", "", None),
    # bytes(n) is calloc'd: the address-space limit is hit without touching pages, however busy the machine is
    "memory_bomb": ("blocks = []\nwhile True:\n    blocks.append(bytes(50 * 1024 * 1024))", "MemoryError", None),
    "output_flood": ("while True:\n    print('x' * 65536)", "(output cut", None),
    "os_exit": ("import os\nos._exit(9)", "ended the interpreter (exit status 9)", False),
    "kill_self": ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "", False),
    "kill_the_parent": ("import os, signal\nfor pid in (os.getppid(), 1, -1):\n    try:\n"
                        "        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass", "", None),
    "background_child": ("import os, time\nif os.fork() == 0:\n    time.sleep(600)\nprint('parent done')",
                         "parent done", False),
    "deep_recursion": ("import sys\nsys.setrecursionlimit(10 ** 6)\ndef f(n):\n    return f(n + 1)\nf(0)", "", None),
    "read_host_secret": (f"print(open({SECRET!r}).read())", "Error", False),
    "write_outside": ("\n".join(f"try:\n    open({p!r}, 'w').write('pwned')\nexcept OSError as e:\n    print('no')"
                                for p in WRITE_TARGETS), "no", False),
    "network": ("import socket\nfor host in ('127.0.0.1', '8.8.8.8'):\n    try:\n"
                "        socket.create_connection((host, {port}), timeout=1)\n        print('CONNECTED')\n"
                "    except OSError:\n        print('refused')", "refused", False),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_hostile_cell_ends_only_its_call(backend, attack, tools, listener):
    cell, expected, timed_out = ATTACKS[attack]
    cell = cell.replace("{port}", str(listener.getsockname()[1]))
    s = tools(backend).open_session()
    try:
        assert s.call("kept = 'still here'").output == ""
        r = s.call(cell)  # must return (not raise), within the limits
        assert isinstance(r, ToolResult)
        assert expected in r.output, r.output
        if timed_out is not None:
            assert r.timed_out == timed_out, r
        assert len(r.output) < 200 + 300  # cut to max_output_chars plus the note
        assert TOKEN not in r.output and "CONNECTED" not in r.output
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected
        for path in WRITE_TARGETS:
            assert not os.path.exists(path), path
        with open(SECRET) as f:
            assert f.read() == TOKEN
        # the same session goes on, with the state from before the attack
        after = s.call("print(kept)")
        assert after.output == "still here" and not after.error, after
    finally:
        s.close()


def test_find_call_only_at_the_end_of_a_closed_python_block():
    tool = PythonTool(ToolConfig())
    assert tool.find_call("Let me compute.\n```python\nprint(2 + 3)\n```\n") == "print(2 + 3)"
    assert tool.find_call("```python\nx = 1\nprint(x)\n```") == "x = 1\nprint(x)"
    assert tool.find_call("```py\nprint(1)\n```\n\n") == "print(1)"
    assert tool.find_call("```python\nprint(1)\n```\nSo the answer is 1.") is None  # the block is not at the end
    assert tool.find_call("```\nprint(1)\n```\n") is None  # not a python block
    assert tool.find_call("```python\n\n```\n") is None  # empty
    assert tool.find_call("```python\nprint(1)\n```\n```output\n1\n```\n```python\ny = 2\n```\n") == "y = 2"


def test_output_is_cut_with_a_note():
    tool = PythonTool(ToolConfig(max_output_chars=10))
    assert tool.cut("0123456789\n") == "0123456789"
    # 13 chars > 10: the first 10 - 10 // 2 = 5 and the last 10 // 2 = 5 stay
    assert tool.cut("0123456789abc") == "01234\n... (output cut: middle left out) ...\n89abc"
    assert tool.cut("short", "TimeoutError: x", truncated=True) == "short\n... (output cut)\nTimeoutError: x"
    assert tool.render(ToolResult("")) == "```output\n(no output)\n```\n"
