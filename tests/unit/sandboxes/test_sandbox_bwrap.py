"""The bwrap backend, for real: isolation (uid, network, file system), limits, clean-up, read-back."""
from __future__ import annotations

import os
import pwd
import socket
import threading

import pytest
from components import needs_bwrap

from reasonrl.sandboxes import Limits, SandboxError, get_sandbox
from reasonrl.sandboxes.bwrap import BwrapSandbox
from sandbox_leftovers import leftover_sandbox_processes

pytestmark = needs_bwrap()


@pytest.fixture(scope="module")
def box() -> BwrapSandbox:
    return get_sandbox("bwrap")


def run_py(box, source, limits=None, **kw):
    return box.run({"main.py": source}, ["python3", "main.py"], limits, **kw)


def sandbox_uids():
    return {u.pw_uid for u in pwd.getpwall() if u.pw_name.startswith("reasonrl-sbx")}


def test_runs_program_with_files_stdin_and_exit_code(box):
    res = box.run({"main.py": "import sys, helper\nprint(helper.X, sys.stdin.read())\nsys.exit(3)",
                   "helper.py": "X = 41 + 1"}, ["python3", "main.py"], stdin="from stdin")
    assert res.exit_code == 3
    assert res.stdout == "42 from stdin\n"
    assert not res.timed_out


def test_runs_as_unprivileged_uid_with_only_given_files(box):
    res = run_py(box, "import os\nprint(os.getuid(), os.getgid())\nprint(sorted(os.listdir('.')))\n"
                      "print(os.path.exists('/root/.bashrc'), os.path.exists('/home'), os.listdir('/tmp'))")
    uid, gid = map(int, res.stdout.splitlines()[0].split())
    assert uid != 0 and gid != 0
    assert uid in sandbox_uids() or os.geteuid() != 0
    assert res.stdout.splitlines()[1] == "['main.py']"
    # the host's /tmp is full of files; the sandbox's /tmp is the image's empty directory
    assert res.stdout.splitlines()[2].startswith("False") and res.stdout.splitlines()[2].endswith("[]")


def test_host_secrets_are_not_readable(box, tmp_path):
    res = run_py(box, "for p in ['/etc/shadow', '/root']:\n"
                      "    try:\n        open(p).read() if p.endswith('shadow') else __import__('os').listdir(p)\n"
                      "        print('READ', p)\n    except OSError as e:\n        print('DENIED', p)")
    assert "READ" not in res.stdout
    assert res.stdout.count("DENIED") == 2


def test_no_network(box):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    res = run_py(box, f"import socket\ns = socket.socket()\ns.settimeout(2)\n"
                      f"try:\n    s.connect(('127.0.0.1', {port})); print('CONNECTED')\n"
                      f"except OSError as e:\n    print('FAILED', type(e).__name__)\n"
                      f"import os\nprint(sorted(os.listdir('/sys/class/net')) if os.path.exists('/sys/class/net') else 'no-sys')")
    with pytest.raises(socket.timeout):
        server.accept()  # nobody reached the host
    server.close()
    assert "FAILED" in res.stdout and "CONNECTED" not in res.stdout


def test_wall_clock_limit_kills_the_program(box):
    res = run_py(box, "import time\ntime.sleep(60)", Limits(timeout_s=1))
    assert res.timed_out and res.exit_code != 0
    assert res.wall_s < 10  # killed at ~1 s, not after the 60 s sleep


def test_cpu_limit(box):
    res = run_py(box, "while True: pass", Limits(timeout_s=20, cpu_s=1))
    assert res.timed_out  # SIGXCPU after 1 CPU second
    assert res.wall_s < 15


def test_memory_limit(box):
    res = run_py(box, "x = bytearray(600 * 1024 * 1024)\nprint('ALLOCATED')", Limits(memory_mb=256))
    assert "ALLOCATED" not in res.stdout and "MemoryError" in res.stderr
    assert res.oom_killed


def test_process_limit_stops_a_fork_bomb(box):
    source = ("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
              "            time.sleep(30); os._exit(0)\n        n += 1\nexcept OSError as e:\n"
              "    print('LIMIT', n, e.errno)")
    res = run_py(box, source, Limits(pids=16, timeout_s=10))
    assert res.stdout.startswith("LIMIT")
    assert int(res.stdout.split()[1]) == 15  # pids=16: the program itself + 15 children, then EAGAIN
    assert not leftover_sandbox_processes()  # the sleeping children died with the sandbox


def test_tmpfs_and_file_size_limits(box):
    big_file = "open('big', 'wb').write(b'x' * (3 << 20))\nprint('WROTE')"
    res = run_py(box, big_file, Limits(file_size_mb=1))
    assert "WROTE" not in res.stdout and "File too large" in res.stderr
    many_files = ("try:\n    for i in range(8): open(f'f{i}', 'wb').write(b'x' * (1 << 20))\n    print('WROTE')\n"
                  "except OSError as e:\n    print('FULL', e.errno)")
    res = run_py(box, many_files, Limits(tmpfs_mb=4, file_size_mb=2))
    assert res.stdout.startswith("FULL 28")  # ENOSPC: the 4 MiB tmpfs is full before 8 MiB are written


def test_output_is_truncated(box):
    res = run_py(box, "import sys\nsys.stdout.write('y' * 500000)", Limits(output_bytes=1000))
    assert res.truncated and res.stdout == "y" * 1000


def test_root_is_read_only_and_host_untouched(box):
    marker = "/tmp/reasonrl_bwrap_should_not_exist"
    res = run_py(box, f"for p in ['{marker}', '/usr/evil', '/etc/evil']:\n"
                      f"    try:\n        open(p, 'w').write('x'); print('WROTE', p)\n"
                      f"    except OSError:\n        print('DENIED', p)")
    assert res.stdout.count("DENIED") == 3
    assert not os.path.exists(marker) and not os.path.exists("/usr/evil") and not os.path.exists("/etc/evil")


def test_background_processes_do_not_outlive_the_run(box):
    res = run_py(box, "import os, subprocess\nsubprocess.Popen(['sleep', '300'], start_new_session=True)\n"
                      "print('SPAWNED')")
    assert res.stdout == "SPAWNED\n"
    assert not leftover_sandbox_processes()


def test_a_run_killed_at_its_time_limit_leaves_no_process(box):
    # PID 1 of the sandbox is in its own session; killing only bwrap's group left it (and the sleeps) to die later
    # through --die-with-parent, after run() had returned and the uid slot was free for the next run
    res = run_py(box, "import subprocess, time\nfor _ in range(5):\n    subprocess.Popen(['sleep', '300'])\n"
                      "time.sleep(300)", Limits(timeout_s=1))
    assert res.timed_out and res.exit_code != 0
    assert not leftover_sandbox_processes()


def test_read_back_returns_files_but_no_symlinked_host_files(box):
    res = box.run({"main.py": "import os\nopen('out.txt', 'w').write('result')\nos.symlink('/etc/passwd', 'leak')"},
                  ["python3", "main.py"], read_back=["out.txt", "leak", "missing"])
    assert res.files == {"out.txt": b"result"}


def test_bad_file_paths_are_refused(box):
    for path in ("../escape.py", "/abs.py"):
        with pytest.raises(SandboxError):
            box.run({path: "print(1)"}, ["python3", "-c", "print(1)"])


def test_concurrent_runs_use_separate_uids(box, monkeypatch):
    # Four runs hold their uid slots at the same time: each waits, slot in hand, until all four have one (the order
    # is made explicit here, not left to how fast the threads happen to start).
    all_hold_a_slot = threading.Barrier(4, timeout=300)
    acquire = box.slots.acquire

    def acquire_then_wait_for_the_others():
        slot = acquire()
        all_hold_a_slot.wait()
        return slot

    monkeypatch.setattr(box.slots, "acquire", acquire_then_wait_for_the_others)
    results = []

    def work():
        results.append(run_py(box, "import os\nprint(os.getuid())"))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    uids = [int(r.stdout) for r in results]
    assert len(set(uids)) == 4  # four runs at once, four different sandbox users
