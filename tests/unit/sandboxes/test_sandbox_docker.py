"""The docker backend, for real: container settings, limits enforced inside, container replacement."""
from __future__ import annotations

import os
import socket
import threading

import pytest
from components import needs_docker

from reasonrl.sandboxes import Limits
from reasonrl.sandboxes.docker_pool import DockerSandbox

pytestmark = needs_docker()


@pytest.fixture(scope="module")
def box():
    sandbox = DockerSandbox(pool_size=2)
    yield sandbox
    sandbox.close()


def run_py(box, source, limits=None, **kw):
    return box.run({"main.py": source}, ["python3", "main.py"], limits, **kw)


def only_container(box):
    box.warm(1)
    c = box._idle.get()
    box._idle.put(c)
    return c


def test_runs_program_with_files_stdin_and_exit_code(box):
    res = box.run({"main.py": "import sys, helper\nprint(helper.X, sys.stdin.read())\nsys.exit(3)",
                   "pkg/helper.py": "", "helper.py": "X = 41 + 1"}, ["python3", "main.py"], stdin="from stdin")
    assert res.exit_code == 3
    assert res.stdout == "42 from stdin\n"


def test_container_settings(box):
    c = only_container(box)
    attrs = box.client.api.inspect_container(c.id)
    host = attrs["HostConfig"]
    assert host["Init"] is True
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert host["Memory"] == (512 + 256) << 20 and host["PidsLimit"] == 64 + 16
    assert host["NanoCpus"] == 1_000_000_000
    assert "size=64m" in host["Tmpfs"]["/work"]
    assert host["ShmSize"] == 64 << 20 and host["IpcMode"] == "private"  # /dev/shm: Limits.shm_mb, not shared
    assert host["Sysctls"] == {"kernel.shm_rmid_forced": "1"}  # a segment dies with its last attached process
    assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
    assert attrs["Config"]["Image"].startswith("reasonrl-sandbox:")


def test_job_runs_unprivileged_without_network_on_a_read_only_root(box):
    res = run_py(box, "import os, socket\nprint(os.getuid())\n"
                      "for p in ['/etc/evil', '/usr/evil', '/work/evil']:\n"
                      "    try:\n        open(p, 'w'); print('WROTE', p)\n    except OSError:\n        print('DENIED', p)\n"
                      "s = socket.socket()\ns.settimeout(2)\n"
                      "try:\n    s.connect(('8.8.8.8', 53)); print('CONNECTED')\nexcept OSError:\n    print('NO NETWORK')\n"
                      "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])")
    lines = res.stdout.splitlines()
    assert int(lines[0]) >= 100_000  # the per-container job uid, not root
    assert lines[1:4] == ["DENIED /etc/evil", "DENIED /usr/evil", "DENIED /work/evil"]
    assert lines[4] == "NO NETWORK"
    assert lines[5] == "0000000000000000"  # no capabilities at all


def test_time_limit_is_enforced_inside_the_container(box):
    c = only_container(box)
    res = run_py(box, "import subprocess, time\nsubprocess.Popen(['sleep', '300'], start_new_session=True)\n"
                      "time.sleep(300)", Limits(timeout_s=1))
    assert res.timed_out and res.wall_s < 10
    # the dispatcher killed the program and its escaped child; the same container stays in service
    top = box.client.api.top(c.id)
    assert len(top["Processes"]) == 2  # only docker-init and the dispatcher are left
    assert not [p for p in top["Processes"] if p[0] != "root" or p[-1].startswith("sleep")]
    assert run_py(box, "print('next')").stdout == "next\n"


def test_limits_memory_processes_file_size_output(box):
    res = run_py(box, "x = bytearray(700 * 1024 * 1024)\nprint('ALLOCATED')", Limits(memory_mb=256))
    assert "ALLOCATED" not in res.stdout and res.oom_killed
    res = run_py(box, "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
                      "            time.sleep(30); os._exit(0)\n        n += 1\nexcept OSError:\n    print('LIMIT', n)",
                 Limits(pids=16))
    assert res.stdout == "LIMIT 15\n"  # pids=16: the program + 15 children
    res = run_py(box, "open('big', 'wb').write(b'x' * (3 << 20))\nprint('WROTE')", Limits(file_size_mb=1))
    assert "WROTE" not in res.stdout and "File too large" in res.stderr
    res = run_py(box, "import sys\nsys.stdout.write('y' * 500000)", Limits(output_bytes=1000))
    assert res.truncated and res.stdout == "y" * 1000


def test_work_dir_is_fresh_for_every_run(box):
    run_py(box, "open('left_behind', 'w').write('x')")
    res = run_py(box, "import os\nprint(sorted(os.listdir('.')), os.listdir('/work'))")
    assert res.stdout == "['main.py'] ['job']\n"


def test_read_back(box):
    res = box.run({"main.py": "import os\nopen('out.txt', 'w').write('result')\nos.symlink('/etc/passwd', 'leak')"},
                  ["python3", "main.py"], read_back=["out.txt", "leak"])
    assert res.files == {"out.txt": b"result"}


def test_a_container_that_dies_is_replaced(box):
    c = only_container(box)
    replaced = box.replaced
    killer = threading.Timer(0.5, lambda: box.client.api.kill(c.id))
    killer.start()
    res = run_py(box, "import time\ntime.sleep(5)\nprint('done')", Limits(timeout_s=8))
    killer.join()
    assert res.stdout == "" and res.exit_code != 0
    assert box.replaced == replaced + 1
    assert run_py(box, "print('fresh')").stdout == "fresh\n"


def test_concurrent_runs_use_the_pool(box):
    out = []
    threads = [threading.Thread(target=lambda: out.append(run_py(box, "import time\ntime.sleep(0.3)\nprint('ok')")))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.stdout for r in out] == ["ok\n"] * 4
    assert box._count <= box.pool_size


def test_host_is_not_visible(box):
    host_secret = f"/root/reasonrl_docker_secret_{os.getpid()}"
    with open(host_secret, "w") as f:
        f.write("s3cret")
    try:
        res = run_py(box, f"import os\nprint(os.path.exists('{host_secret}'), os.listdir('/root') if os.access('/root', os.R_OK) else 'noaccess')")
        assert res.stdout.startswith("False")
        assert socket.gethostname() not in res.stdout
    finally:
        os.unlink(host_secret)


def test_containers_do_not_outlive_a_killed_owner(box):
    import subprocess
    import sys

    code = ("import os\nfrom reasonrl.sandboxes.docker_pool import DockerSandbox\nbox = DockerSandbox(pool_size=1)\n"
            "print(box.run({}, ['python3', '-c', 'print(5)']).stdout, end='', flush=True)\nos._exit(0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout == "5\n"
    # the owner's attach stream closed -> the dispatcher's stdin ends -> the container exits and is removed
    # (auto_remove): wait for the daemon's "removed" event of each foreign container, not for a clock.
    import docker

    for c in box.client.containers.list(all=True, filters={"label": "reasonrl.sandbox"}):
        if c.labels.get("reasonrl.owner") != box.owner:
            try:
                c.wait(condition="removed", timeout=120)
            except docker.errors.NotFound:  # already removed
                pass
    owners = [c.labels.get("reasonrl.owner")
              for c in box.client.containers.list(all=True, filters={"label": "reasonrl.sandbox"})]
    assert all(o == box.owner for o in owners)


def test_stale_containers_of_dead_owners_are_removed(box):
    from reasonrl.sandboxes.docker_pool import WarmContainer, remove_stale_containers

    dead_owner = f"{socket.gethostname()}:{2 ** 22 + 12345}"  # above the default pid_max: no such process
    orphan = WarmContainer(box.client, box.image, box.limits, 1.0, dead_owner)
    try:
        assert remove_stale_containers(box.client) == 1
        assert not box.client.containers.list(all=True, filters={"label": f"reasonrl.owner={dead_owner}"})
    finally:
        orphan.remove()
