"""Hostile programs against the code verifier, on both backends: each scores 0, the host is untouched, and the
next call still works.

Every attack is a *wrong* program that would score above 0 only if its trick worked: leaking a host secret the
tests compare against, reaching the network, forging the verdict, ending the harness early, or fooling ``==``.
"""
from __future__ import annotations

import os
import secrets
import socket
import stat

import pytest
from components import needs_bwrap, needs_docker

from reasonrl.verifiers import get_verifier
from sandbox_leftovers import leftover_sandbox_processes

BACKENDS = [
    pytest.param("bwrap", marks=needs_bwrap()),
    pytest.param("docker", marks=needs_docker()),
]
ADD = {"tests": ["assert add(1, 2) == 3", "assert add(2, 5) == 7", "assert add(-1, 4) == 3"], "test_imports": []}
TOKEN = secrets.token_hex(8)
HOST_FILES = {  # host secrets a program must never read
    "root": f"/root/reasonrl_attack_{TOKEN}",
    "etc": f"/etc/reasonrl_attack_{TOKEN}",
    "tmp": f"/tmp/reasonrl_attack_{TOKEN}",
}
WRITE_TARGETS = [f"/tmp/reasonrl_pwned_{TOKEN}", f"/root/reasonrl_pwned_{TOKEN}", f"/etc/reasonrl_pwned_{TOKEN}",
                 f"/work/../reasonrl_pwned_{TOKEN}", f"/var/tmp/reasonrl_pwned_{TOKEN}"]


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


@pytest.fixture(scope="module", autouse=True)
def host_secrets():
    for path in HOST_FILES.values():
        with open(path, "w") as f:
            f.write(TOKEN)
        os.chmod(path, 0o600 if not path.startswith("/tmp") else 0o644)  # even a world-readable /tmp file
    yield
    for path in list(HOST_FILES.values()) + WRITE_TARGETS:
        if os.path.exists(path):
            os.unlink(path)


def leak_task(path: str) -> dict:
    with open(path) as f:
        secret = f.read()
    return {"tests": [f"assert leak() == {secret!r}"], "test_imports": []}


def reader(path: str) -> str:
    return (f"def leak():\n    try:\n        return open({path!r}).read()\n    except Exception as e:\n"
            f"        return repr(e)")


ATTACKS = {
    # (program, ground truth or None for ADD)
    "infinite_loop_at_import": ("while True:\n    pass\ndef add(a, b):\n    return a + b", None),
    "infinite_loop_in_call": ("def add(a, b):\n    while True:\n        pass", None),
    "sleep_past_the_limit": ("import time\ntime.sleep(600)\ndef add(a, b):\n    return a + b", None),
    "fork_bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", None),
    "fork_bomb_in_call": ("import os\ndef add(a, b):\n    while True:\n        try:\n            os.fork()\n"
                          "        except OSError:\n            pass", None),
    "memory_bomb": ("blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 1024 * 1024))", None),
    "output_flood": ("import sys\nwhile True:\n    sys.stdout.write('@@REASONRL-VERDICT ' + 'x' * 65536)\n", None),
    "exit_zero_before_tests": ("import sys\nsys.exit(0)\ndef add(a, b):\n    return a + b", None),
    "os_exit_zero_before_tests": ("import os\nos._exit(0)\ndef add(a, b):\n    return a + b", None),
    "exit_inside_the_call": ("import os\ndef add(a, b):\n    os._exit(0)", None),
    "always_equal_object": ("class Anything:\n    def __eq__(self, other):\n        return True\n"
                            "    __ne__ = lambda self, other: False\n    __hash__ = object.__hash__\n"
                            "def add(a, b):\n    return Anything()", None),
    "always_equal_int_subclass": ("class Int(int):\n    def __eq__(self, other):\n        return True\n"
                                  "    __hash__ = int.__hash__\ndef add(a, b):\n    return Int(0)", None),
    "patched_builtins": ("import builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})\n"
                         "builtins.isinstance = lambda *a: True\ndef add(a, b):\n    return None", None),
    "fake_pass_line": ("import os, sys, json\nline = '@@REASONRL-VERDICT ' + '0' * 32 + ' ' + json.dumps("
                       "{'results': [{'passed': True}] * 3, 'load_error': None}) + '\\n'\n"
                       "for fd in range(1, 20):\n    try:\n        os.write(fd, line.encode())\n    except OSError:\n"
                       "        pass\nfor p in ['/proc/1/fd/1', f'/proc/{os.getppid()}/fd/1', '/dev/stdout']:\n"
                       "    try:\n        open(p, 'w').write(line)\n    except OSError:\n        pass\n"
                       "print(line)\nsys.exit(0)", None),
    "kill_the_parent": ("import os, signal\nfor pid in (os.getppid(), 1, -1):\n    try:\n"
                        "        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
                        "def add(a, b):\n    return 0", None),
    "stop_the_parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\ndef add(a, b):\n    return 0", None),
    "read_the_judges_stdin": ("import os\ndef add(a, b):\n    for p in [f'/proc/{os.getppid()}/fd/0', '/proc/1/fd/0',\n"
                              "              f'/proc/{os.getppid()}/mem', f'/proc/{os.getppid()}/environ']:\n"
                              "        try:\n            if 'assert' in open(p, errors='replace').read(100000):\n"
                              "                return a + b\n        except OSError:\n            pass\n"
                              "    return 0", None),
    "overwrite_the_harness": ("import glob\nfor p in glob.glob('*.py'):\n    open(p, 'w').write('print(1)')\n"
                              "def add(a, b):\n    return 0", None),
    "crash_the_interpreter": ("import sys\nsys.setrecursionlimit(10 ** 6)\ndef add(a, b):\n    return add(a, b)", None),
    "network_connect": ("import socket\ndef add(a, b):\n    for host in ('127.0.0.1', '{gateway}', '8.8.8.8'):\n"
                        "        try:\n            socket.create_connection((host, {port}), timeout=1).close()\n"
                        "            return a + b\n        except OSError:\n            pass\n    return 0", None),
    "read_etc_shadow": (reader("/etc/shadow"), "/etc/shadow"),
    "read_root_file": (reader(HOST_FILES["root"]), HOST_FILES["root"]),
    "read_etc_file": (reader(HOST_FILES["etc"]), HOST_FILES["etc"]),
    "read_host_tmp_file": (reader(HOST_FILES["tmp"]), HOST_FILES["tmp"]),
    "write_outside_the_work_dir": ("\n".join(f"try:\n    open({p!r}, 'w').write('pwned')\nexcept OSError:\n    pass"
                                             for p in WRITE_TARGETS) + "\ndef add(a, b):\n    return 0", None),
}


def host_gateway_ip() -> str:
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(("10.255.255.255", 1))
        return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_attack_scores_zero_and_leaves_everything_healthy(backend, attack, listener):
    program, secret_path = ATTACKS[attack]
    program = program.replace("{port}", str(listener.getsockname()[1])).replace("{gateway}", host_gateway_ip())
    task = leak_task(secret_path) if secret_path else ADD
    v = get_verifier("code", sandbox=backend, timeout_s=4)

    result = v.verify(fenced(program), task)
    assert result.score == 0.0 and not result.correct, result.info

    # the host is untouched
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody connected
    for path in WRITE_TARGETS:
        assert not os.path.exists(os.path.normpath(path)), path
    for path in HOST_FILES.values():
        with open(path) as f:
            assert f.read() == TOKEN
    assert stat.S_IMODE(os.stat("/etc/shadow").st_mode) & 0o004 == 0
    if backend == "bwrap":
        assert not leftover_sandbox_processes()  # nothing of the program survived its run

    # and the next call works
    good = v.verify(fenced("def add(a, b):\n    return a + b"), ADD)
    assert good.score == 1.0, good.info


# Attacks on the harness that then answer right: the policy is that an attack scores 0 anyway, on every backend.
# (Under bwrap the harness starts as PID 1 of its namespace, which the kernel shields from signals sent from
# inside; before the judge ran as its child these programs scored 1 there and 0 under Docker.)
RIGHT_ADD = "def add(a, b):\n    return a + b"
HARNESS_ATTACKS = {
    # program, the reason the verifier must give
    "sigkill_the_judge_at_import": ("import os\nos.kill(os.getppid(), 9)\n" + RIGHT_ADD, "killed by signal 9"),
    "sigkill_the_judge_in_the_last_call": (
        "import os\ncalls = []\ndef add(a, b):\n    calls.append(1)\n    if len(calls) == 3:\n"
        "        os.kill(os.getppid(), 9)\n    return a + b", "killed by signal 9"),
    "sigkill_everything_it_can": ("import os\ndef add(a, b):\n    try:\n        os.kill(-1, 9)\n    except OSError:\n"
                                  "        pass\n    return a + b", "killed by signal 9"),
    "sigterm_the_judge": ("import os\nos.kill(os.getppid(), 15)\n" + RIGHT_ADD, "killed by signal 15"),
    # a KeyboardInterrupt in the judge would fail only the test it interrupted: 2/3 without the policy
    "sigint_the_judge_in_the_first_call": (
        "import os\ncalls = []\ndef add(a, b):\n    calls.append(1)\n    if len(calls) == 1:\n"
        "        os.kill(os.getppid(), 2)\n    return a + b", "killed by signal 2"),
    "sigstop_the_judge": ("import os\nos.kill(os.getppid(), 19)\n" + RIGHT_ADD, "time limit"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("attack", sorted(HARNESS_ATTACKS))
def test_a_program_that_attacks_the_harness_scores_zero_even_with_right_answers(backend, attack):
    program, reason = HARNESS_ATTACKS[attack]
    v = get_verifier("code", sandbox=backend, timeout_s=4)
    result = v.verify(fenced(program), ADD)
    assert result.score == 0.0 and not result.correct, result.info
    assert reason in result.info["reason"], result.info
    if backend == "bwrap":
        assert not leftover_sandbox_processes()
    # the same program without the attack passes: the zero comes from the attack alone
    assert v.verify(fenced(RIGHT_ADD), ADD).score == 1.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_harness_killed_after_its_verdict_scores_zero(backend, monkeypatch):
    """A process of the program that outlives it (its own session) could kill the judge just after the verdict is
    written; no program can time that reliably, so the harness command is wrapped to do it: run the real harness,
    then SIGKILL the wrapper (as PID 1 of bwrap's namespace, where the kernel drops that signal, exit 128 + 9 the
    way the PID-1 warden reports a killed judge). The verdict on stdout says all tests passed; it must not count."""
    from reasonrl.verifiers import code

    def wrapped(then):
        return ["python3", "-I", "-S", "-c", "import os, subprocess, sys\n"
                f"subprocess.run({code.HARNESS_COMMAND!r})\nsys.stdout.flush()\n{then}\n"]

    v = get_verifier("code", sandbox=backend, timeout_s=4)
    monkeypatch.setattr(code, "HARNESS_COMMAND", wrapped("os._exit(0)"))
    assert v.verify(fenced(RIGHT_ADD), ADD).score == 1.0  # the wrapper passes the verdict through
    monkeypatch.setattr(code, "HARNESS_COMMAND", wrapped("os.kill(os.getpid(), 9)\nos._exit(137)"))
    result = v.verify(fenced(RIGHT_ADD), ADD)
    assert result.info["exit_code"] in (-9, 137), result.info
    assert result.score == 0.0 and "killed by signal 9" in result.info["reason"], result.info


# A wrong program must not score by reading what an earlier (right) program left behind. Each channel stores and
# loads a JSON dict "a,b" -> a + b through one place a run could share with the next.
CHANNELS = {
    "dev_shm_file": (
        "def store(d):\n    open('/dev/shm/answers', 'w').write(json.dumps(d))\n"
        "def load():\n    return json.load(open('/dev/shm/answers'))\n"),
    "posix_shm": (
        "import _posixshmem, mmap\n"
        "def store(d):\n    fd = _posixshmem.shm_open('/answers', os.O_CREAT | os.O_RDWR, 0o666)\n"
        "    os.ftruncate(fd, 4096)\n    os.pwrite(fd, json.dumps(d).encode().ljust(4096), 0)\n"
        "def load():\n    fd = _posixshmem.shm_open('/answers', os.O_RDONLY, 0)\n"
        "    return json.loads(os.pread(fd, 4096, 0).strip())\n"),
    "posix_mqueue": (
        "import ctypes\nrt = ctypes.CDLL('librt.so.1', use_errno=True)\n"
        "def store(d):\n    q = rt.mq_open(b'/answers', os.O_CREAT | os.O_RDWR, 0o666, None)\n"
        "    data = json.dumps(d).encode()\n    rt.mq_send(q, data, len(data), 0)\n"
        "def load():\n    q = rt.mq_open(b'/answers', os.O_RDONLY | os.O_NONBLOCK, 0, None)\n"
        "    buf = ctypes.create_string_buffer(1 << 16)\n    n = rt.mq_receive(q, buf, len(buf), None)\n"
        "    d = json.loads(buf.raw[:n])\n    store(d)\n    return d\n"),
    "sysv_shm": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
        "def segment(size, flags):\n    sid = libc.shmget(0x5EED, size, flags)\n    if sid < 0:\n"
        "        raise OSError(ctypes.get_errno(), 'shmget')\n    return libc.shmat(sid, None, 0)\n"
        "def store(d):\n    addr = segment(4096, 0o1666)\n"
        "    ctypes.memmove(addr, json.dumps(d).encode() + b'\\0', len(json.dumps(d)) + 1)\n"
        "def load():\n    addr = segment(0, 0)\n"
        "    return json.loads(ctypes.string_at(addr))\n"),
}
PLANT_WHILE_RIGHT = ("answers = {}\ndef add(a, b):\n    answers[f'{a},{b}'] = a + b\n    try:\n        store(answers)\n"
                     "    except Exception:\n        pass\n    return a + b\n")
READ_LEFTOVERS = ("def add(a, b):\n    try:\n        return load()[f'{a},{b}']\n    except Exception:\n"
                  "        return 0\n")
PLANT_AT_IMPORT = "try:\n    store({'1,2': 3, '2,5': 7, '-1,4': 3})\nexcept Exception:\n    pass\n"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("channel", sorted(CHANNELS))
def test_a_wrong_program_cannot_read_what_an_earlier_right_one_left(backend, channel):
    v = get_verifier("code", sandbox=backend, timeout_s=4)  # docker: one warm container, so the runs share it
    prelude = "import json, os\n" + CHANNELS[channel]
    assert v.verify(fenced(prelude + PLANT_WHILE_RIGHT), ADD).score == 1.0
    cheat = v.verify(fenced(prelude + READ_LEFTOVERS), ADD)
    assert cheat.score == 0.0, cheat.info
    # within one run the channel works (so the zero above is the reset's doing), except System V IPC under bwrap,
    # which the sandbox takes away (ENOSYS)
    control = v.verify(fenced(prelude + PLANT_AT_IMPORT + READ_LEFTOVERS), ADD)
    assert control.score == (0.0 if (backend, channel) == ("bwrap", "sysv_shm") else 1.0), control.info
