"""Nothing crosses between sandbox runs, every writable tmpfs has a size, and nothing a run allocates outlives it:
hostile programs on both real backends (bubblewrap, Docker).

A docker sandbox here has one warm container, so consecutive runs share it: what the first run leaves in the
container is exactly what the next could read. Under bwrap every run has its own namespaces; the tests show the
next run sees nothing and that, once a run returns, no process on the host is left in its IPC or mount namespace
(so its tmpfs files and IPC objects are freed with them).
"""
from __future__ import annotations

import json
import os

import pytest
from components import needs, needs_bwrap, needs_docker

from reasonrl.sandboxes import Limits, get_sandbox

BACKENDS = [
    pytest.param("bwrap", marks=[pytest.mark.bwrap,
                                 needs_bwrap()]),
    pytest.param("docker", marks=[pytest.mark.docker,
                                  needs_docker()]),
]
MiB = 1 << 20
LIMITS = Limits(timeout_s=20, cpu_s=20, memory_mb=512, shm_mb=32, tmpfs_mb=32)

# Leaves something in every place a run might share with the next: a file in /dev/shm, a POSIX shared memory
# object, a POSIX message queue, System V shared memory (300 MiB, detached), a semaphore set and a message queue.
# Prints JSON: which of them it managed to create, its IPC and mount namespaces (inode numbers).
PLANTER = r'''
import ctypes, errno, json, os
from multiprocessing import shared_memory
made = {}
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, fn):
    try:
        made[name] = fn()
    except OSError as e:
        made[name] = "error " + errno.errorcode.get(e.errno, str(e.errno))
def shm_file():
    with open("/dev/shm/answers", "w") as f:
        f.write("42")
    return "ok"
def posix_shm():
    m = shared_memory.SharedMemory(name="answers_shm", create=True, size=4096)
    m.buf[:2] = b"42"
    m.close()
    return "ok"
def check(ret):
    if ret < 0:
        raise OSError(ctypes.get_errno(), "")
    return ret
def posix_mq():
    rt = ctypes.CDLL("librt.so.1", use_errno=True)
    check(rt.mq_open(b"/answers_mq", os.O_CREAT | os.O_RDWR, 0o666, None))
    return "ok"
def sysv_shm():
    sid = check(libc.shmget(0x5EED, 300 * 1024 * 1024, 0o1666))
    libc.shmat.restype = ctypes.c_void_p
    addr = libc.shmat(sid, None, 0)
    ctypes.memset(addr, 7, 300 * 1024 * 1024)
    libc.shmdt(ctypes.c_void_p(addr))
    return "ok"
attempt("shm_file", shm_file)
attempt("posix_shm", posix_shm)
attempt("posix_mq", posix_mq)
attempt("sysv_shm", sysv_shm)
attempt("sysv_sem", lambda: "ok" if check(libc.semget(0x5EED, 1, 0o1666)) >= 0 else "")
attempt("sysv_msg", lambda: "ok" if check(libc.msgget(0x5EED, 0o1666)) >= 0 else "")
made["ns"] = {k: os.stat(f"/proc/self/ns/{k}").st_ino for k in ("ipc", "mnt")}
print(json.dumps(made))
'''

# Looks for anything an earlier run left: prints JSON of what it found.
LOOKER = r'''
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
rt = ctypes.CDLL("librt.so.1", use_errno=True)
found = {}
for d in ("/dev/shm", "/dev/mqueue"):
    found[d] = sorted(os.listdir(d)) if os.path.isdir(d) else []
for t in ("shm", "sem", "msg"):
    found["sysv_" + t] = open("/proc/sysvipc/" + t).read().splitlines()[1:]
found["mq_open"] = rt.mq_open(b"/answers_mq", os.O_RDONLY, 0, None) >= 0
found["shmget_key"] = libc.shmget(0x5EED, 0, 0) >= 0
print(json.dumps(found))
'''


@pytest.fixture(scope="module")
def boxes():
    made = {}

    def get(backend):
        if backend not in made:
            options = {"pool_size": 1} if backend == "docker" else {}
            made[backend] = get_sandbox(backend, limits=LIMITS, **options)
        return made[backend]

    yield get
    for box in made.values():
        box.close()


def run_json(box, source):
    res = box.run({"main.py": source}, ["python3", "main.py"], LIMITS)
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


def processes_in_namespace(kind: str, inode: int):
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}/ns/{kind}").st_ino == inode:
                    found.append(int(name))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_next_run_sees_nothing_an_earlier_run_left(backend, boxes):
    box = boxes(backend)
    made = run_json(box, PLANTER)
    for what in ("shm_file", "posix_shm", "posix_mq"):
        assert made[what] == "ok", made  # the planting worked: the clean slate below is not for lack of trying
    if backend == "docker":
        assert all(made[k] == "ok" for k in ("sysv_shm", "sysv_sem", "sysv_msg")), made
    else:  # bwrap takes System V IPC away (seccomp): it would be charged to no limit of the run
        assert all(made[k] == "error ENOSYS" for k in ("sysv_shm", "sysv_sem", "sysv_msg")), made
    replaced = getattr(box, "replaced", 0)
    found = run_json(box, LOOKER)
    assert found == {"/dev/shm": [], "/dev/mqueue": [], "sysv_shm": [], "sysv_sem": [], "sysv_msg": [],
                     "mq_open": False, "shmget_key": False}, found
    assert getattr(box, "replaced", 0) == replaced  # docker: the same container, reset, not thrown away
    if backend == "bwrap":
        for kind, inode in made["ns"].items():
            assert not processes_in_namespace(kind, inode), kind  # the run's namespaces are gone from the host


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_writable_tmpfs_has_a_size(backend, boxes):
    """Fill every writable place with 8 MiB files (under RLIMIT_FSIZE) until it refuses; each holds at most its
    limit (32 MiB for /dev/shm and /work here), /dev itself takes nothing."""
    program = r'''
import json, os
held = {}
for d in ("/dev/shm", os.getcwd(), "/dev", "/tmp", "/var/tmp"):
    total = 0
    for i in range(64):
        try:
            with open(f"{d}/fill{i}", "wb") as f:
                for _ in range(8):
                    f.write(b"x" * (1 << 20))
                    total += 1 << 20
        except OSError:
            break
    held[d] = total
print(json.dumps(held))
'''
    held = run_json(boxes(backend), program)
    work = [d for d in held if d.startswith("/work")][0]
    assert 16 * MiB <= held["/dev/shm"] <= 32 * MiB, held
    assert 16 * MiB <= held[work] <= 32 * MiB, held
    assert held["/dev"] == held["/tmp"] == held["/var/tmp"] == 0, held


CGROUP_USAGE = ("/sys/fs/cgroup/memory/memory.usage_in_bytes", "/sys/fs/cgroup/memory.current")
MEMORY_PROBE = ("import json\nfor p in %r:\n    try:\n        print(json.dumps(int(open(p).read())))\n        break\n"
                "    except OSError:\n        pass\n" % (CGROUP_USAGE,))


@pytest.mark.docker
@needs_docker()
def test_docker_memory_of_a_run_is_charged_to_it_and_freed_after_it(boxes):
    """A 300 MiB System V segment kept attached by a background process, and 24 MiB of /dev/shm files: while the
    run holds them the container's memory cgroup is charged for them; the next run finds the charge gone."""
    box = boxes("docker")
    before = run_json(box, MEMORY_PROBE)
    holder = MEMORY_PROBE.replace("import json\n", r'''
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
sid = libc.shmget(0x5EED, 300 << 20, 0o1600)
addr = libc.shmat(sid, None, 0)
ctypes.memset(addr, 7, 300 << 20)
for i in range(3):
    with open(f"/dev/shm/hold{i}", "wb") as f:
        f.write(b"x" * (8 << 20))
r, w = os.pipe()
if os.fork() == 0:  # a background process keeps the segment attached past the run
    os.close(w)
    os.read(r, 1)
    os._exit(0)
libc.shmdt(ctypes.c_void_p(addr))
''', 1)
    during = run_json(box, holder)
    after = run_json(box, MEMORY_PROBE)
    assert during - before >= 300 * MiB, (before, during)  # charged: 324 MiB written, minus noise
    assert after - before <= 32 * MiB, (before, during, after)  # and freed


# Each child tries System V shared memory through an ABI other than the native one, and the parent prints how the
# child ended: by the filter's SIGSYS (31), not with a segment. x32: syscall number 0x40000000 | 29 (shmget);
# 32-bit: machine code "mov eax, 117 (ipc); mov ebx, 23 (SHMGET); mov ecx, 0 (IPC_PRIVATE); mov edx, 4096;
# mov esi, 0o1600; int 0x80; ret" in an executable page.
OTHER_ABIS = r'''
import ctypes, mmap, os, struct
libc = ctypes.CDLL(None, use_errno=True)
def x32():
    return libc.syscall(0x40000000 | 29, 0, 4096, 0o1600)
def i386():
    code = (b"\xb8" + struct.pack("<I", 117) + b"\xbb" + struct.pack("<I", 23) + b"\xb9" + struct.pack("<I", 0)
            + b"\xba" + struct.pack("<I", 4096) + b"\xbe" + struct.pack("<I", 0o1600) + b"\xcd\x80\xc3")
    page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
    return ctypes.CFUNCTYPE(ctypes.c_int)(addr)()
for name, fn in (("x32", x32), ("i386", i386)):
    pid = os.fork()
    if pid == 0:
        print(name, "returned", fn(), flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print(name, "signal", os.WTERMSIG(status) if os.WIFSIGNALED(status) else None, flush=True)
print(len(open("/proc/sysvipc/shm").read().splitlines()) - 1, "segments")
'''


@pytest.mark.bwrap
@needs_bwrap()
@needs("an x86_64 CPU", os.uname().machine == "x86_64", "x32 and the 32-bit int 0x80 ABI exist on x86_64 only")
def test_bwrap_system_v_ipc_has_no_door_through_another_abi(boxes):
    res = boxes("bwrap").run({"main.py": OTHER_ABIS}, ["python3", "main.py"], LIMITS)
    lines = res.stdout.splitlines()
    assert "x32 signal 31" in lines and "i386 signal 31" in lines, res.stdout + res.stderr
    assert lines[-1] == "0 segments", res.stdout


# Opens POSIX message queues of the default size (10 messages of 8 KiB: 80 KiB and a little bookkeeping each,
# charged to RLIMIT_MSGQUEUE at creation) until the kernel refuses; prints how many it got.
FILL_QUEUES = r'''
import ctypes, os
rt = ctypes.CDLL("librt.so.1", use_errno=True)
run = os.urandom(4).hex()  # names of this run's own: an earlier run's queues are not reopened
made = 0
while made < 100 and rt.mq_open(f"/q{run}-{made}".encode(), os.O_CREAT | os.O_RDWR, 0o600, None) >= 0:
    made += 1
print(made)
'''


@pytest.mark.parametrize("backend", BACKENDS)
def test_posix_queues_stop_at_their_limit_and_are_freed_after_the_run(backend, boxes):
    """512 KiB of RLIMIT_MSGQUEUE hold 6 default queues (6 x ~80 KiB = 480 KiB; a 7th would pass 512 KiB). The
    second run gets as many again: the first run's queues were freed (under docker both runs use one job uid,
    whose queue bytes would otherwise still be spent)."""
    box = boxes(backend)
    assert [run_json(box, FILL_QUEUES) for _ in range(2)] == [6, 6]
