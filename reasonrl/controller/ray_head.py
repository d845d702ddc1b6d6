"""A local Ray head in a session of its own, so that a signal to the driver's process group (what ``timeout``, a
terminal's Ctrl-C on a job, ``kill -TERM -<pgid>`` send) reaches the driver only: Ray's GCS, raylet and workers live
on until the driver has finished its step and saved, then stop with ``stop_local_head``.

``ray.init()`` of a new local cluster starts those processes in the driver's own process group, where the group's
signal kills them under the step in flight. Here the head is ``ray start --head --block`` started with
``start_new_session=True``; ``--block`` makes that command own its processes (they die with it, by the kernel's
parent-death signal) and stop them when it gets SIGTERM. The command itself gets SIGTERM when the driver dies
(``PR_SET_PDEATHSIG``), so a driver killed with ``kill -9`` leaves no Ray process behind either. The cluster gets a
token of its own (``RAY_AUTH_TOKEN``), so it never depends on a token file another cluster on the machine writes.
"""
from __future__ import annotations

import ctypes
import os
import secrets
import signal
import subprocess
import sys
import threading
from typing import Callable, List, Optional

from .placement import free_port

START_TIMEOUT_S = 180.0
"""How long ``ray start`` may take to say that the runtime started (a loaded 2-core machine takes ~15 s)."""
STOP_TIMEOUT_S = 30.0
"""How long the head may take to stop its processes after SIGTERM before it is killed (it takes ~3 s)."""
STARTED = "Ray runtime started"
_PR_SET_PDEATHSIG = 1


class LocalHead:
    """A running ``ray start --head --block`` in its own session: ``address`` for ``ray.init``, ``pid`` (also the
    session id of every Ray process of the cluster)."""

    def __init__(self, num_cpus: Optional[int]) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.token = secrets.token_hex(32)
        command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={self.port}",
                   "--include-dashboard=false", "--disable-usage-stats"]
        if num_cpus is not None:
            command.append(f"--num-cpus={num_cpus}")
        env = {"RAY_AUTH_MODE": "token", **os.environ, "RAY_AUTH_TOKEN": self.token,  # an explicit mode is kept
               "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}  # on SIGTERM stop at once (no 30 s drain)
        self.proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                     preexec_fn=_term_on_parent_death)
        self.pid = self.proc.pid
        self.stopping = False
        self.lines: List[str] = []
        self._started = threading.Event()
        threading.Thread(target=self._read, name="ray-head-output", daemon=True).start()
        if not self._started.wait(START_TIMEOUT_S) or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError("the local Ray head did not start:\n" + "".join(self.lines[-30:]))
        forget_current_cluster(self.port)

    def _read(self) -> None:
        """Keep ``ray start``'s output (the pipe must be drained while it runs); set ``_started`` when it says so, or
        when it exits."""
        for line in self.proc.stdout:
            self.lines = (self.lines + [line])[-200:]
            if STARTED in line:
                self._started.set()
        started = self._started.is_set()
        self._started.set()
        self.proc.wait()
        if started and not self.stopping and on_lost is not None:  # stopped under the run (SIGTERM to the job)
            on_lost()

    def stop(self) -> None:
        """SIGTERM to ``ray start``, which stops the cluster's processes; SIGKILL to its whole session if it has not
        exited after ``STOP_TIMEOUT_S``."""
        self.stopping = True
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            os.killpg(self.pid, signal.SIGKILL)  # anything of its session still about (a worker that outlived it)
        except (ProcessLookupError, PermissionError):
            pass


def forget_current_cluster(port: int, address_file: Optional[str] = None) -> bool:
    """Remove Ray's record of this machine's latest cluster (``ray_current_cluster``, which a bare ``ray.init()``
    elsewhere on the machine would join, and which ``ray start`` leaves behind when its head is stopped by a signal)
    when it names this head's ``port``; the driver connects by address and never reads it. True when removed."""
    if address_file is None:
        try:
            from ray._common.utils import get_ray_address_file
        except ImportError:
            return False
        address_file = get_ray_address_file(None)
    try:
        with open(address_file) as f:
            if not f.read().strip().endswith(f":{port}"):
                return False
        os.remove(address_file)
    except OSError:
        return False
    return True


def _term_on_parent_death() -> None:
    """In the child before exec: SIGTERM when the driver dies, whatever kills it."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_head: Optional[LocalHead] = None
on_lost: Optional[Callable[[], None]] = None
"""Called (from the head's output thread) when the head exits while the run still uses it: a SIGTERM to every
process of the job (Slurm, systemd) stopped Ray under the run. The CLI sets it to say where a resume starts and
exit at once, rather than wait out Ray's 60 s of "Failed to connect to GCS"."""


def start_local_head(num_cpus: Optional[int]) -> LocalHead:
    """Start the head (once per process), and give this process its token for ``ray.init(address=...)``, with token
    authentication on unless ``RAY_AUTH_MODE`` says otherwise (``ray.init`` turns it on by itself only for a cluster
    it finds, not for an address it is given)."""
    global _head
    if _head is None or _head.proc.poll() is not None:
        _head = LocalHead(num_cpus)
        os.environ["RAY_AUTH_TOKEN"] = _head.token
        if "RAY_AUTH_MODE" not in os.environ:
            from ray._private.authentication.authentication_token_setup import _enable_token_auth

            _enable_token_auth()  # RAY_AUTH_MODE=token, and Ray's cached config of this process reloaded
    return _head


def stop_local_head() -> None:
    """Disconnect from Ray and stop the head started here (nothing when none was)."""
    global _head, on_lost
    import ray

    on_lost = None
    ray.shutdown()
    if _head is not None:
        _head.stop()
        _head = None
