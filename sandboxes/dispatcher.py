"""The long-lived dispatcher inside each warm docker sandbox container (standard library only).

Started as ``python3 -I -S -c <this source> UID`` under the container's init (``--init``), as root with a few
capabilities. It reads one job per line from stdin (JSON: ``files`` base64, ``command``, ``stdin`` base64,
``limits``, ``read_back``), and for each job:

1. writes the files into a fresh ``/work/job`` (the container's size-limited tmpfs), owned by the job uid;
2. starts the command as the unprivileged job uid (no capabilities) in its own session, with rlimits (CPU,
   address space, processes, file size, open files) and stdout/stderr going to memfds (capped by RLIMIT_FSIZE);
3. enforces the wall-clock limit *here*, inside the container: at the deadline, and after every job, a helper
   that has become the job uid sends SIGKILL to every process of that uid (``kill(-1)``) until none is left,
   so nothing started by a job survives it, whoever holds the exec socket;
4. resets what a job could leave behind for the next one: removes every System V shared memory segment,
   semaphore set and message queue (as the job uid, their creator), empties ``/dev/shm`` and ``/dev/mqueue``
   and ``/work``, then checks that all of them are empty; if anything is left, it says ``healthy: false`` and
   the host replaces the container. So a job starts with nothing of any earlier job, and nothing it allocated
   is still held once its answer is out. (The container also runs with ``kernel.shm_rmid_forced=1``: a segment
   is destroyed when its last process detaches, so none survives its job even between the kill and the reset.)
5. answers one JSON line on stdout.

The job uid cannot write to this process's stdout (it holds no descriptor for it, and a root process is not
ptrace-able by it), so a job cannot forge an answer.
"""
import base64
import ctypes
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import time

WORK = "/work"
JOB_DIR = "/work/job"
MiB = 1 << 20
MSGQUEUE_BYTES = 512 << 10  # as sandboxes/common.py
IPC_DIRS = ("/dev/shm", "/dev/mqueue")  # POSIX shared memory and message queues: emptied after every job
SYSV_TABLES = ("shm", "sem", "msg")  # /proc/sysvipc/<table>: one line per object after a header line
IPC_RMID = 0
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": JOB_DIR, "TMPDIR": JOB_DIR, "LANG": "C.UTF-8",
       "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}


def _live_processes_of(uid):
    """Pids of ``uid`` other than the caller that are not zombies (a zombie holds no resources)."""
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            found.append(int(name))
    return found


def sysv_objects():
    """(table, id) of every System V IPC object in this IPC namespace."""
    found = []
    for table in SYSV_TABLES:
        with open(f"/proc/sysvipc/{table}") as f:
            found += [(table, int(line.split()[1])) for line in f.read().splitlines()[1:] if line.strip()]
    return found


LIBC = ctypes.CDLL(None, use_errno=True)  # loaded once; the forked helpers inherit it


def remove_sysv_objects():
    """IPC_RMID every System V object (allowed to its creator: call this as the job uid)."""
    libc = LIBC
    for table, ident in sysv_objects():
        if table == "shm":
            libc.shmctl(ident, IPC_RMID, None)
        elif table == "sem":
            libc.semctl(ident, 0, IPC_RMID)
        else:
            libc.msgctl(ident, IPC_RMID, None)


def kill_uid(uid):
    """SIGKILL every process of ``uid``, from a helper that takes that uid, until none is left alive; then, as
    that uid, remove the System V IPC objects it created.

    ``kill(-1, SIGKILL)`` as that uid reaches exactly its processes in this pid namespace (the dispatcher and
    init are root); repeating it catches processes forked while the previous round ran."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            for _ in range(200):
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                if not _live_processes_of(uid):
                    remove_sysv_objects()
                    os._exit(0)
                time.sleep(0.002)
            os._exit(1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def clear_ipc():
    """Empty /dev/shm and /dev/mqueue (root with CAP_FOWNER may delete in these sticky directories); return
    whether they and the System V tables are all empty now."""
    for top in IPC_DIRS:
        if os.path.isdir(top):
            empty_directory(top)
    return not sysv_objects() and not any(os.path.isdir(top) and os.listdir(top) for top in IPC_DIRS)


# wait_for and reap repeat sandboxes/common.py's on purpose: this file runs alone, as source text, inside the
# container (standard library only), so it cannot import the package.
def wait_for(proc, timeout):
    """Wait for a Popen child up to ``timeout`` seconds, woken by a pidfd (Popen.wait polls with sleeps of up to
    50 ms); return (exit code as Popen reports it, CPU seconds used by the child and its reaped descendants)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (OSError, AttributeError):
        fd = None
    if fd is not None:
        try:
            if not select.select([fd], [], [], max(0.0, timeout))[0]:
                raise subprocess.TimeoutExpired(proc.args, timeout)
        finally:
            os.close(fd)
    else:
        proc.wait(timeout=timeout)  # the fallback: after this, rusage is no longer available
        return proc.returncode, 0.0
    return reap(proc)


def reap(proc):
    """Reap an exited (or killed) Popen child with wait4; return (exit code, CPU seconds)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def empty_directory(top):
    """Remove everything inside ``top`` (links are removed, never followed)."""
    for name in os.listdir(top):
        path = os.path.join(top, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass


def clear_work():
    empty_directory(WORK)


def memfd(data=b""):
    fd = os.memfd_create("io", 0)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def head(fd, limit):
    size = os.fstat(fd).st_size
    data = os.pread(fd, min(size, limit), 0) if size else b""
    return data.decode("utf-8", "replace"), size > limit


def run_job(job, uid):
    limits = job.get("limits", {})
    timeout = float(limits.get("timeout_s", 10))
    out_limit = int(limits.get("output_bytes", 65536))
    hard_msgqueue = resource.getrlimit(resource.RLIMIT_MSGQUEUE)[1]  # as sandboxes/common.py's msgqueue_bytes
    msgqueue = MSGQUEUE_BYTES if hard_msgqueue == resource.RLIM_INFINITY else min(MSGQUEUE_BYTES, hard_msgqueue)
    rlimits = [
        (resource.RLIMIT_CPU, int(limits.get("cpu_s", 10)), int(limits.get("cpu_s", 10)) + 1),
        (resource.RLIMIT_AS, int(limits.get("memory_mb", 512)) * MiB, int(limits.get("memory_mb", 512)) * MiB),
        (resource.RLIMIT_FSIZE, int(limits.get("file_size_mb", 16)) * MiB, int(limits.get("file_size_mb", 16)) * MiB),
        (resource.RLIMIT_NPROC, int(limits.get("pids", 64)), int(limits.get("pids", 64))),
        (resource.RLIMIT_NOFILE, 256, 256),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_MSGQUEUE, msgqueue, msgqueue),
    ]
    clear_work()
    os.mkdir(JOB_DIR, 0o700)
    for path, data in job.get("files", {}).items():
        full = os.path.normpath(os.path.join(JOB_DIR, path))
        if not full.startswith(JOB_DIR + "/"):
            return {"error": f"bad path {path!r}"}
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(base64.b64decode(data))
    for dirpath, dirnames, filenames in os.walk(JOB_DIR):
        os.chown(dirpath, uid, uid)
        for name in filenames:
            os.chown(os.path.join(dirpath, name), uid, uid)

    def drop_privileges():
        for key, soft, hard in rlimits:
            resource.setrlimit(key, (soft, hard))
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")
        except OSError:
            pass

    stdin_fd = memfd(base64.b64decode(job.get("stdin", "")))
    out_fd, err_fd = memfd(), memfd()
    start = time.monotonic()
    timed_out = False
    try:
        proc = subprocess.Popen(job["command"], cwd=JOB_DIR, env=ENV, stdin=stdin_fd, stdout=out_fd, stderr=err_fd,
                                user=uid, group=uid, extra_groups=[], start_new_session=True,
                                preexec_fn=drop_privileges, close_fds=True)
        try:
            returncode, cpu = wait_for(proc, timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_uid(uid)
            returncode, cpu = reap(proc)
    except OSError as exc:
        returncode, cpu = 127, 0.0
        os.write(err_fd, f"could not start {job['command'][:1]}: {exc}".encode())
    wall = time.monotonic() - start
    healthy = kill_uid(uid)  # whatever the job left running in the background, and its System V objects
    healthy = clear_ipc() and healthy
    stdout, cut_out = head(out_fd, out_limit)
    stderr, cut_err = head(err_fd, out_limit)
    for fd in (stdin_fd, out_fd, err_fd):
        os.close(fd)
    files = {}
    for path in job.get("read_back", []):
        full = os.path.normpath(os.path.join(JOB_DIR, path))
        if not full.startswith(JOB_DIR + "/") or os.path.realpath(full) != full:
            continue
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if os.path.stat.S_ISREG(os.fstat(fd).st_mode):
                files[path] = base64.b64encode(os.read(fd, int(limits.get("file_size_mb", 16)) * MiB)).decode()
        finally:
            os.close(fd)
    clear_work()
    return {"exit_code": returncode, "stdout": stdout, "stderr": stderr, "timed_out": timed_out, "cpu_s": cpu,
            "wall_s": wall, "truncated": cut_out or cut_err, "files": files, "healthy": healthy}


def main():
    uid = int(sys.argv[1])
    os.chmod(WORK, 0o755)  # only the job's own directory is writable by the job
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("-1000")  # needs CAP_SYS_RESOURCE, which we may lack; jobs get +1000 either way
    except OSError:
        pass
    out = sys.stdout
    out.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            job = json.loads(line)
            reply = run_job(job, uid)
            reply["id"] = job.get("id")
        except Exception as exc:  # a broken job must not take the dispatcher down
            reply = {"error": f"{type(exc).__name__}: {exc}"}
            try:
                kill_uid(uid)
                clear_ipc()
                clear_work()
            except Exception:
                pass
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
