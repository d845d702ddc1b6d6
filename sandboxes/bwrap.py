"""The bwrap backend: bubblewrap namespaces + rlimits, run as an unprivileged uid.

Each run: take a free uid slot (``reasonrl-sbx<k>`` users when we are root: RLIMIT_NPROC counts per real uid,
so concurrent runs must not share one), then ``prlimit ... bwrap ... -- command`` as that uid (switched by a
``setpriv`` prefix, so the run starts with ``vfork``: ``Popen(user=...)`` makes CPython copy the whole caller with
``fork``, which costs in proportion to its memory, about 0.3 s a run from a process holding a model) with

* ``--unshare-all`` (user, pid, net, ipc, uts, cgroup namespaces: no network at all), ``--die-with-parent``,
  ``--new-session``, ``--as-pid-1``: the command itself is pid 1 of its namespace, so no helper process holds
  its stdin where the program could read it through /proc, the kernel shields it from signals sent from inside
  (the code harness therefore runs its judge as a child, so that an attack on the judge is seen and scores 0,
  as under Docker), orphans are re-parented to it, and when it exits the kernel kills everything left in the
  namespace (so zombies live at most as long as the run);
* a read-only root that holds only the interpreter: the debootstrap tree built by ``.ci/setup_sandboxes.sh``
  when present, else the host's ``/usr`` (no ``/etc``, ``/home``, ``/root``, ``/tmp`` of the host);
* a size-limited tmpfs ``/work`` holding only the given files (copied in through memfds), a size-limited
  tmpfs ``/dev/shm`` (``Limits.shm_mb``), and ``/dev`` itself read-only: every writable tmpfs has a size, so
  files held in memory cannot pass ``tmpfs_mb + shm_mb`` (``RLIMIT_AS`` does not count tmpfs pages);
* a seccomp filter (``seccomp.py``) under which System V ``shmget``/``msgget``/``semget`` fail with ENOSYS:
  such objects would be charged to no limit of the run; POSIX message queues are capped by ``RLIMIT_MSGQUEUE``;
* fresh mount and IPC namespaces per run, so no file, segment or queue of one run is seen by the next, and all
  of them are freed when the run's last process is gone;
* rlimits on CPU seconds, address space, processes, file size, open files; a wall-clock kill from outside,
  aimed at the namespace's PID 1, that returns only once every process of the run is gone.
"""
from __future__ import annotations

import os
import pwd
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple, Union

from .base import ExecResult, FileMap, Limits, SandboxError, SandboxUnavailable
from .common import (MiB, as_bytes, classify_exit, memfd_with, normalize_files, parent_dirs, prlimit_args,
                     read_back_files, read_head, reap, setpriv_args, wait_for)
from .image import SETUP_HINT, rootfs_dir
from .seccomp import sysv_ipc_filter

USER_PREFIX = os.environ.get("REASONRL_SANDBOX_USER", "reasonrl-sbx")
SLOT_DIR = "/run/reasonrl-bwrap"
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/work", "TMPDIR": "/work", "LANG": "C.UTF-8",
       "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
OVERHEAD_PROCS = 1  # the bwrap process outside the namespaces (prlimit execs into it)
SECCOMP_FILTER = sysv_ipc_filter()  # None on an architecture without a syscall table in seccomp.py
KILL_GRACE_S = 30.0  # after SIGKILL to the sandbox's PID 1, how long bwrap may take to follow before it is killed too


class UidSlots:
    """Hands out the sandbox users one run at a time, across threads (a lock) and processes (flock)."""

    def __init__(self, uids: List[Tuple[int, int]]):
        self.uids = uids
        self._locks = [threading.Lock() for _ in uids]
        self._fds: Dict[int, int] = {}
        os.makedirs(SLOT_DIR, mode=0o700, exist_ok=True)

    def _lock_file(self, k: int) -> int:
        if k not in self._fds:
            self._fds[k] = os.open(f"{SLOT_DIR}/slot-{k}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._fds[k]

    def acquire(self) -> int:
        import fcntl
        order = list(range(len(self.uids)))
        random.shuffle(order)
        while True:
            for k in order:
                if self._locks[k].acquire(blocking=False):
                    try:
                        fcntl.flock(self._lock_file(k), fcntl.LOCK_EX | fcntl.LOCK_NB)
                        return k
                    except BlockingIOError:
                        self._locks[k].release()
            time.sleep(0.005)

    def release(self, k: int) -> None:
        import fcntl
        fcntl.flock(self._fds[k], fcntl.LOCK_UN)
        self._locks[k].release()

    def close(self) -> None:
        """Close the lock files of the slots no run holds (a slot in use keeps its file until it is released)."""
        for k in list(self._fds):
            if self._locks[k].acquire(blocking=False):
                try:
                    os.close(self._fds.pop(k))
                finally:
                    self._locks[k].release()


def _sandbox_uids(prefix: str) -> List[Tuple[int, int]]:
    users = sorted((u for u in pwd.getpwall() if u.pw_name.startswith(prefix) and u.pw_uid != 0),
                   key=lambda u: u.pw_name)
    return [(u.pw_uid, u.pw_gid) for u in users]


def _count_processes(uid: int) -> int:
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                count += entry.stat().st_uid == uid
            except OSError:
                pass
    return count


class BwrapSandbox:
    """Sandbox backend on bubblewrap. Thread-safe; cheap to construct; holds no processes between runs."""

    name = "bwrap"

    def __init__(self, limits: Optional[Limits] = None, rootfs: Union[str, None] = "auto", bwrap: str = "bwrap",
                 user_prefix: str = USER_PREFIX) -> None:
        """``rootfs``: "auto" (the built debootstrap tree if present, else the host's /usr), a path, or None
        (host /usr). ``user_prefix``: names of the unprivileged users to run as when we are root."""
        self.limits = limits or Limits()
        self.bwrap = shutil.which(bwrap)
        if self.bwrap is None:
            raise SandboxUnavailable(f"bubblewrap ({bwrap!r}) is not installed; {SETUP_HINT}")
        if shutil.which("prlimit") is None:
            raise SandboxUnavailable("prlimit (util-linux) is not installed")
        self.rootfs = str(rootfs_dir()) if rootfs == "auto" and rootfs_dir() else (None if rootfs == "auto" else rootfs)
        self.is_root = os.geteuid() == 0
        if self.is_root and shutil.which("setpriv") is None:
            raise SandboxUnavailable("setpriv (util-linux) is not installed: as root, runs switch users with it")
        if self.is_root:
            uids = _sandbox_uids(user_prefix)
            if not uids:
                raise SandboxUnavailable(f"no unprivileged '{user_prefix}*' users to run as; {SETUP_HINT}")
            self.slots: Optional[UidSlots] = UidSlots(uids)
        else:
            self.slots = None

    # -- command line -------------------------------------------------------------------------------------------
    def _root_args(self) -> List[str]:
        if self.rootfs:
            return ["--ro-bind", self.rootfs, "/"]
        args = ["--ro-bind", "/usr", "/usr"]
        for top in ("bin", "lib", "lib64", "lib32", "sbin"):
            path = f"/{top}"
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        if os.path.exists("/etc/ld.so.cache"):
            args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
        return args

    def _bwrap_args(self, limits: Limits, file_fds: Dict[str, int], work_bind: Optional[str],
                    seccomp_fd: Optional[int]) -> List[str]:
        args = [self.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1",
                "--hostname", "sandbox"]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        args += self._root_args()
        args += ["--proc", "/proc", "--dev", "/dev",
                 "--size", str(limits.shm_mb * MiB), "--perms", "01777", "--tmpfs", "/dev/shm",
                 "--remount-ro", "/dev"]  # /dev is a tmpfs too: without this, a file there would have no size
        if work_bind:
            args += ["--bind", work_bind, "/work"]
        else:
            args += ["--size", str(limits.tmpfs_mb * MiB), "--perms", "0700", "--tmpfs", "/work"]
            for d in parent_dirs(file_fds):
                args += ["--dir", f"/work/{d}"]
            for path, fd in file_fds.items():
                args += ["--perms", "0644", "--file", str(fd), f"/work/{path}"]
        args += ["--chdir", "/work", "--clearenv"]
        for key, value in ENV.items():
            args += ["--setenv", key, value]
        return args

    # -- running ------------------------------------------------------------------------------------------------
    def run(self, files: FileMap, command: List[str], limits: Optional[Limits] = None, *,
            stdin: Optional[Union[str, bytes]] = None, read_back: Sequence[str] = ()) -> ExecResult:
        """Run ``command`` in a fresh sandbox holding ``files``; see :class:`reasonrl.sandboxes.Sandbox`."""
        limits = limits or self.limits
        if not command:
            raise SandboxError("empty command")
        files_b = normalize_files(files)
        slot = self.slots.acquire() if self.slots else None
        fds: List[int] = []
        work_bind = None
        try:
            if slot is not None:
                uid, gid = self.slots.uids[slot]
                nproc = limits.pids + OVERHEAD_PROCS
            else:
                uid, gid = os.getuid(), os.getgid()
                nproc = _count_processes(uid) + limits.pids + OVERHEAD_PROCS
            file_fds: Dict[str, int] = {}
            if read_back:
                work_bind = self._host_work_dir(files_b, uid, gid)
            else:
                for path, data in files_b.items():
                    file_fds[path] = memfd_with(data, "file")
                    fds.append(file_fds[path])
            stdin_fd = memfd_with(as_bytes(stdin), "stdin")
            out_fd, err_fd = os.memfd_create("stdout"), os.memfd_create("stderr")
            fds += [stdin_fd, out_fd, err_fd]
            pass_fds = list(file_fds.values())
            seccomp_fd = None
            if SECCOMP_FILTER is not None:
                seccomp_fd = memfd_with(SECCOMP_FILTER, "seccomp")  # bwrap reads it to the end: one per run
                fds.append(seccomp_fd)
                pass_fds.append(seccomp_fd)
            argv = (prlimit_args(limits, nproc) + self._bwrap_args(limits, file_fds, work_bind, seccomp_fd)
                    + ["--"] + list(command))
            return self._execute(argv, limits, uid, gid, stdin_fd, out_fd, err_fd, pass_fds, work_bind, read_back)
        finally:
            for fd in fds:
                os.close(fd)
            if work_bind:
                shutil.rmtree(work_bind, ignore_errors=True)
            if slot is not None:
                self.slots.release(slot)

    def _execute(self, argv, limits, uid, gid, stdin_fd, out_fd, err_fd, pass_fds, work_bind, read_back) -> ExecResult:
        if self.is_root:  # as a command prefix, not Popen(user=...): that makes CPython fork where it could vfork
            argv = setpriv_args(uid, gid) + argv
        start = time.monotonic()
        try:
            proc = subprocess.Popen(argv, stdin=stdin_fd, stdout=out_fd, stderr=err_fd, pass_fds=pass_fds,
                                    start_new_session=True, env=dict(ENV), close_fds=True)
        except OSError as exc:
            raise SandboxError(f"could not start bwrap: {exc}") from exc
        timed_out = False
        try:
            returncode, cpu = wait_for(proc, limits.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            returncode, cpu = _kill_sandbox(proc)
        wall = time.monotonic() - start
        stdout, cut_out = read_head(out_fd, limits.output_bytes)
        stderr, cut_err = read_head(err_fd, limits.output_bytes)
        if returncode != 0 and stderr.startswith("bwrap:") and not timed_out:
            raise SandboxError(f"bwrap failed: {stderr.strip()[:500]}")
        flags = classify_exit(returncode, stderr, cpu, limits.cpu_s)
        result = ExecResult(exit_code=returncode, stdout=stdout, stderr=stderr,
                            timed_out=timed_out or flags["cpu_limit"], wall_s=wall, oom_killed=flags["oom_killed"],
                            pids_limit_hit=flags["pids_limit_hit"], truncated=cut_out or cut_err)
        if work_bind:
            result.files = read_back_files(work_bind, read_back, limits.file_size_mb * MiB)
        return result

    def _host_work_dir(self, files: Dict[str, bytes], uid: int, gid: int) -> str:
        """A host directory bound as /work when files must be read back: sized per file only (RLIMIT_FSIZE), so it
        is made on disk (``/var/tmp``), never in the host's memory should its ``/tmp`` be a tmpfs."""
        root = tempfile.mkdtemp(prefix="reasonrl-bwrap-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
        for d in parent_dirs(files):
            os.makedirs(os.path.join(root, d), exist_ok=True)
        for path, data in files.items():
            with open(os.path.join(root, path), "wb") as f:
                f.write(data)
        if self.is_root:
            for dirpath, _, names in os.walk(root):
                os.chown(dirpath, uid, gid)
                for n in names:
                    os.chown(os.path.join(dirpath, n), uid, gid)
        return root

    def close(self) -> None:
        """Nothing of a run is held between runs; the slot lock files are closed."""
        if self.slots is not None:
            self.slots.close()


def _namespace_init(bwrap_pid: int) -> Optional[int]:
    """A pidfd for the sandbox's PID 1 (the child of the outer bwrap process), or None if there is none (yet)."""
    try:
        with open(f"/proc/{bwrap_pid}/task/{bwrap_pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return None
    for child in children:
        try:
            fd = os.pidfd_open(child)
        except OSError:
            continue
        try:  # the pidfd names the right process only if that pid is still bwrap's child now that we hold it
            with open(f"/proc/{child}/stat", "rb") as f:
                if int(f.read().rsplit(b")", 1)[1].split()[1]) == bwrap_pid:
                    return fd
        except (OSError, ValueError, IndexError):
            pass
        os.close(fd)
    return None


def _kill_sandbox(proc: subprocess.Popen) -> Tuple[int, float]:
    """SIGKILL a run past its time and return only once nothing of it is left.

    The sandbox's PID 1 is in a session of its own (``--new-session``), so killing bwrap's process group does
    not reach it: it would die later, through ``--die-with-parent``, while the uid slot is already handed to the
    next run. So kill PID 1 itself; the kernel kills and reaps everything else in its pid namespace before PID 1
    is reported dead, and bwrap exits right after its child. Then reap bwrap (exit code, CPU seconds)."""
    init = _namespace_init(proc.pid)
    if init is not None:
        try:
            signal.pidfd_send_signal(init, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(init)
        try:
            return wait_for(proc, KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    try:  # no PID 1 yet (bwrap still setting up), or bwrap did not follow its child
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return reap(proc)


_USABLE: Optional[Tuple[bool, str]] = None


def bwrap_usable(timeout_s: float = 10.0) -> Tuple[bool, str]:
    """Whether the bwrap backend works here (checked once per process, by the first call: ``exit 7`` run in a sandbox
    that may take ``timeout_s``)."""
    global _USABLE
    if _USABLE is None:
        try:
            box = BwrapSandbox()
            res = box.run({}, ["/bin/sh", "-c", "exit 7"], Limits(timeout_s=timeout_s))
            late = f" (timed out after {timeout_s:g} s)" if res.timed_out else ""
            _USABLE = (res.exit_code == 7, f"probe exited {res.exit_code}{late}: {res.stderr[:200]}")
        except (SandboxError, OSError) as exc:
            _USABLE = (False, str(exc))
    return _USABLE
