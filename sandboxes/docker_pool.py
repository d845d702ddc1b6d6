"""The docker backend: a pool of warm containers, each running a long-lived dispatcher (``dispatcher.py``).

Containers run the registry-free image ``reasonrl-sandbox:<recipe hash>`` (see ``image.py``) with ``--init``,
``--network none``, memory/pids/CPU limits, a read-only root, a size-limited tmpfs ``/work``, a private IPC
namespace with a ``Limits.shm_mb`` ``/dev/shm`` and ``kernel.shm_rmid_forced=1``, all capabilities
dropped except the few the dispatcher needs to switch to the job uid and clean up, and ``no-new-privileges``.
The host talks to the dispatcher over the container's attached stdin/stdout (one JSON line per job), which
avoids the cost of a ``docker exec`` per program. The dispatcher enforces the time limit inside the container; if
it does not answer within the time limit plus a grace period, or the stream breaks, the container is removed
and a fresh one takes its place. Between jobs the dispatcher resets the container's IPC state (System V objects,
``/dev/shm``, ``/dev/mqueue``) and ``/work``; a container it cannot verify empty is replaced. Memory a job puts
in tmpfs or shared memory is charged to the container's memory cgroup, as the rest of its memory.
"""
from __future__ import annotations

import atexit
import base64
import json
import os
import queue
import random
import socket
import struct
import threading
import time
import weakref
from pathlib import Path
from typing import List, Optional, Sequence, Union

from .base import ExecResult, FileMap, Limits, SandboxError, SandboxUnavailable
from .common import as_bytes, classify_exit, normalize_files
from .image import SETUP_HINT, image_tag

DISPATCHER_SOURCE = (Path(__file__).resolve().parent / "dispatcher.py").read_text()
GRACE_S = 5.0  # how long past the time limit the host waits for the dispatcher before replacing the container
LABEL = "reasonrl.sandbox"
CAPS = ["SETUID", "SETGID", "KILL", "CHOWN", "DAC_OVERRIDE", "FOWNER"]


class _Broken(Exception):
    """The container stopped answering or broke the protocol."""


class WarmContainer:
    """One running container and the attached stream to its dispatcher."""

    def __init__(self, client, image: str, limits: Limits, cpus: float, owner: str) -> None:
        api = client.api
        self.job_uid = random.randint(100_000, 999_999)  # RLIMIT_NPROC counts per host uid: one per container
        host_config = api.create_host_config(
            init=True, network_mode="none", read_only=True, auto_remove=True,
            mem_limit=f"{limits.memory_mb + 256}m", memswap_limit=f"{limits.memory_mb + 256}m",
            pids_limit=limits.pids + 16, nano_cpus=int(cpus * 1e9),
            tmpfs={"/work": f"size={limits.tmpfs_mb}m,mode=0755"}, shm_size=f"{limits.shm_mb}m",
            ipc_mode="private", sysctls={"kernel.shm_rmid_forced": "1"},
            cap_drop=["ALL"], cap_add=CAPS, security_opt=["no-new-privileges"])
        created = api.create_container(
            image, command=["python3", "-I", "-S", "-c", DISPATCHER_SOURCE, str(self.job_uid)],
            detach=False, stdin_open=True, user="0", working_dir="/work", network_disabled=True,
            labels={LABEL: "1", "reasonrl.owner": owner}, host_config=host_config)
        self.id = created["Id"]
        self.api = api
        try:
            raw = api.attach_socket(self.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            self.sock: socket.socket = getattr(raw, "_sock", raw)
            api.start(self.id)
            self._buffer = b""
            self._lines: List[bytes] = []
            self.stderr_tail = b""
            hello = self._read_line(30.0)
            if not json.loads(hello).get("ready"):
                raise _Broken(f"dispatcher did not start: {hello[:200]!r}")
        except BaseException:
            self.remove()
            raise

    def _read_line(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while not self._lines:
            header = self._recv_exact(8, deadline)
            stream, size = header[0], struct.unpack(">I", header[4:])[0]
            payload = self._recv_exact(size, deadline)
            if stream == 2:
                self.stderr_tail = (self.stderr_tail + payload)[-4000:]
                continue
            self._buffer += payload
            *complete, self._buffer = self._buffer.split(b"\n")
            self._lines.extend(complete)
        return self._lines.pop(0)

    def _recv_exact(self, n: int, deadline: float) -> bytes:
        chunks = []
        while n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Broken("no answer from the dispatcher in time")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(min(n, 1 << 20))
            except socket.timeout:
                raise _Broken("no answer from the dispatcher in time") from None
            except OSError as exc:
                raise _Broken(f"stream error: {exc}") from None
            if not chunk:
                raise _Broken("the container's stream closed: " + self.stderr_tail.decode(errors="replace")[-300:])
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def request(self, job: dict, timeout: float) -> dict:
        try:
            self.sock.settimeout(timeout)
            self.sock.sendall(json.dumps(job).encode() + b"\n")
        except OSError as exc:
            raise _Broken(f"could not send the job: {exc}") from None
        reply = json.loads(self._read_line(timeout))
        if reply.get("id") != job["id"]:
            raise _Broken(f"out-of-order reply {reply!r:.200}")
        return reply

    def remove(self) -> None:
        try:
            self.sock.close()
        except Exception:
            pass
        try:
            self.api.remove_container(self.id, force=True)
        except Exception:
            pass


class DockerSandbox:
    """Sandbox backend on the Docker Engine. Thread-safe: each container serves one run at a time."""

    name = "docker"

    def __init__(self, limits: Optional[Limits] = None, pool_size: int = 2, image: Optional[str] = None,
                 cpus: float = 1.0, client=None) -> None:
        """``limits``: defaults per run; memory/pids/tmpfs also size the containers (cgroup limits).
        ``pool_size``: most containers kept warm (started lazily, one per concurrent run).
        ``image``: defaults to the current recipe's ``reasonrl-sandbox:<hash>``. ``cpus``: CPU quota each."""
        try:
            import docker
        except ImportError as exc:  # pragma: no cover - the SDK is a dependency
            raise SandboxUnavailable("the docker Python SDK is not installed") from exc
        self.limits = limits or Limits()
        self.pool_size = max(1, int(pool_size))
        self.cpus = cpus
        try:
            self.client = client or docker.from_env(timeout=60)
            self.client.ping()
        except Exception as exc:
            raise SandboxUnavailable(f"the Docker daemon is unreachable ({exc}); {SETUP_HINT}") from exc
        self.image = image or image_tag()
        try:
            self.client.images.get(self.image)
        except Exception as exc:
            raise SandboxUnavailable(f"docker image {self.image} is missing; {SETUP_HINT}") from exc
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._idle: "queue.LifoQueue[WarmContainer]" = queue.LifoQueue()
        self._count = 0
        self._lock = threading.Lock()
        self._all: "weakref.WeakSet[WarmContainer]" = weakref.WeakSet()
        self._closed = False
        self.replaced = 0  # containers thrown away because they misbehaved
        remove_stale_containers(self.client)
        atexit.register(_close_quietly, weakref.ref(self))

    def _take(self) -> WarmContainer:
        while True:
            try:
                return self._idle.get_nowait()
            except queue.Empty:
                pass
            with self._lock:
                if self._count < self.pool_size:
                    self._count += 1
                    break
            try:
                return self._idle.get(timeout=0.5)
            except queue.Empty:
                continue
        try:
            box = WarmContainer(self.client, self.image, self.limits, self.cpus, self.owner)
        except Exception as exc:
            with self._lock:
                self._count -= 1
            raise SandboxError(f"could not start a sandbox container: {exc}") from exc
        self._all.add(box)
        return box

    def _discard(self, box: WarmContainer) -> None:
        box.remove()
        with self._lock:
            self._count -= 1
            self.replaced += 1

    def warm(self, n: Optional[int] = None) -> None:
        """Start up to ``n`` (default ``pool_size``) containers now instead of on first use."""
        boxes = [self._take() for _ in range(min(n or self.pool_size, self.pool_size))]
        for box in boxes:
            self._idle.put(box)

    def run(self, files: FileMap, command: List[str], limits: Optional[Limits] = None, *,
            stdin: Optional[Union[str, bytes]] = None, read_back: Sequence[str] = ()) -> ExecResult:
        """Run ``command`` in a fresh work dir of a warm container; see :class:`reasonrl.sandboxes.Sandbox`."""
        if self._closed:
            raise SandboxError("this DockerSandbox is closed")
        limits = limits or self.limits
        if not command:
            raise SandboxError("empty command")
        job = {
            "id": f"{os.getpid()}-{random.getrandbits(48):x}",
            "files": {p: base64.b64encode(d).decode() for p, d in normalize_files(files).items()},
            "command": [str(c) for c in command],
            "stdin": base64.b64encode(as_bytes(stdin)).decode(),
            "limits": {k: getattr(limits, k) for k in ("timeout_s", "cpu_s", "memory_mb", "pids", "file_size_mb",
                                                        "output_bytes")},
            "read_back": [str(p) for p in read_back],
        }
        box = self._take()
        start = time.monotonic()
        try:
            reply = box.request(job, limits.timeout_s + GRACE_S)
        except (_Broken, ValueError) as exc:
            self._discard(box)
            return ExecResult(exit_code=-9, stderr=f"sandbox container replaced: {exc}", timed_out=True,
                              wall_s=time.monotonic() - start)
        if reply.get("healthy") is False:  # the job left processes it could not kill: start afresh
            self._discard(box)
        else:
            self._idle.put(box)
        if "error" in reply:
            raise SandboxError(f"dispatcher error: {reply['error']}")
        flags = classify_exit(reply["exit_code"], reply["stderr"], reply.get("cpu_s", 0.0), limits.cpu_s)
        return ExecResult(exit_code=reply["exit_code"], stdout=reply["stdout"], stderr=reply["stderr"],
                          timed_out=reply["timed_out"] or flags["cpu_limit"], wall_s=reply["wall_s"],
                          oom_killed=flags["oom_killed"],
                          pids_limit_hit=flags["pids_limit_hit"], truncated=reply["truncated"],
                          files={p: base64.b64decode(d) for p, d in reply.get("files", {}).items()})

    def close(self) -> None:
        """Remove every container this sandbox started."""
        self._closed = True
        for box in list(self._all):
            box.remove()
        self._all.clear()
        try:
            self.client.close()  # its connection pool's sockets
        except Exception:
            pass


def _close_quietly(ref) -> None:
    box = ref()
    if box is not None:
        try:
            box.close()
        except Exception:
            pass


def remove_stale_containers(client) -> int:
    """Remove sandbox containers whose owning process (on this host) is gone, e.g. a killed pool worker."""
    host = socket.gethostname()
    removed = 0
    try:
        containers = client.containers.list(all=True, filters={"label": LABEL})
    except Exception:
        return 0
    for c in containers:
        owner = c.labels.get("reasonrl.owner", "")
        owner_host, _, pid = owner.rpartition(":")
        if owner_host != host or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            continue
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            c.remove(force=True)
            removed += 1
        except Exception:
            pass
    return removed


def docker_usable(timeout_s: float = 10.0) -> tuple:
    """Whether the docker daemon answers within ``timeout_s`` and the sandbox image exists (no container is
    started)."""
    try:
        import docker
        client = docker.from_env(timeout=timeout_s)
        client.ping()
        client.images.get(image_tag())
        return True, "ok"
    except Exception as exc:
        return False, str(exc)
