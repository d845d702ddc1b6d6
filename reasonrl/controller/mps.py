"""NVIDIA's Multi-Process Service for a GPU that two processes share (``async_rollout.share_devices``: the actor
and its rollout replica on one GPU, docs/async.md "The same GPU for both").

Without MPS the driver time-slices two processes on one GPU: each takes the whole GPU in turn, so a decode step of
the long tail holds its turn with few SMs busy. Under MPS (``nvidia-cuda-mps-control -d``) their kernels run side by
side. On one H100 the same-GPU mode trained 0.82x colocated time-sliced, 1.19x under MPS, and 1.30x under MPS with
the publish off the critical path (twenty-first to twenty-third sessions,
``benchmarks/results/s2{1,2,3}_async_*.json``).

A CUDA process becomes the daemon's client when it initialises CUDA, so the daemon must be up before the workers
start; it quits once its clients are gone, which is why ``quit_daemon`` sends ``quit`` without waiting (a waiting
process that is itself a client would wait forever). ``async_rollout.mps`` chooses (``decide``): ``auto`` starts
the daemon for a shared GPU on a local cluster when the control binary is there and none runs (and says so), uses
one that runs, and otherwise says that the two processes will time-slice; ``required`` refuses to go on without it;
``disabled`` leaves the GPU as it is (not ``on``/``off``: YAML reads those as booleans)."""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

CONTROL = "nvidia-cuda-mps-control"
DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"  # NVIDIA's, when CUDA_MPS_PIPE_DIRECTORY is not set
QUITTERS: List[subprocess.Popen] = []
"""The ``quit`` senders started (the tests wait for them)."""


@dataclass(frozen=True)
class Decision:
    """What a run does about MPS: ``action`` is ``start`` (start the daemon), ``use`` (one runs already) or
    ``none``; ``note`` is the line the run prints (empty: nothing to say); ``error`` refuses the run
    (``mps=required``)."""

    action: str
    note: str = ""
    error: str = ""


def pipe_directory(env: Mapping[str, str]) -> str:
    return env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIRECTORY


def daemon_running(control: Optional[str]) -> bool:
    """Whether a control daemon answers on this environment's pipe directory (``get_server_list``: exit status 0;
    without one the control binary says "Cannot find MPS control daemon process" and exits 1). No binary: no daemon
    this process could use."""
    if control is None:
        return False
    try:
        asked = subprocess.run([control], input="get_server_list\n", text=True, capture_output=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return asked.returncode == 0


def decide(mode: str, shared_gpu: bool, local_cluster: bool, control: Optional[str], running: bool) -> Decision:
    """The choice for ``async_rollout.mps=mode`` (see the module docstring). ``shared_gpu``: share_devices on a
    CUDA device; ``control``: the control binary's path (None: not found); ``running``: a daemon is up."""
    if mode == "disabled" or not shared_gpu:
        return Decision("none")
    if running:
        return Decision("use", "MPS: a daemon runs already; the actor and its replica share the GPU through it")
    time_sliced = ("the actor and its replica will take turns on the GPU (time-slicing: 0.82x colocated on an H100, "
                   "against 1.30x under MPS; docs/async.md)")
    if not local_cluster:
        missing = "the run joins a Ray cluster (trainer.ray_address), whose machines start their own MPS daemons"
    elif control is None:
        missing = f"{CONTROL} is not on PATH"
    else:
        return Decision("start", f"MPS: starting {CONTROL} for the shared GPU (async_rollout.mps={mode}); it quits "
                                 "when the run's processes have ended")
    if mode == "required":
        return Decision("none", error=f"async_rollout.mps=required: no MPS daemon runs and none can be started here: "
                                      f"{missing}")
    return Decision("none", f"MPS: not started ({missing}): {time_sliced}; async_rollout.mps=disabled silences this")


def start_daemon(control: str) -> None:
    """Start the control daemon on the pipe directory of ``pipe_directory`` (NVIDIA's default unless set, where every
    client looks), its log under /tmp unless ``CUDA_MPS_LOG_DIRECTORY`` is set (the default, under /var/log, needs
    root)."""
    env = dict(os.environ)
    env.setdefault("CUDA_MPS_LOG_DIRECTORY", os.path.join(tempfile.gettempdir(), "reasonrl-mps-log"))
    for folder in (pipe_directory(env), env["CUDA_MPS_LOG_DIRECTORY"]):
        os.makedirs(folder, exist_ok=True)
    subprocess.run([control, "-d"], stdin=subprocess.DEVNULL, check=True, timeout=30, env=env)


def quit_daemon(control: str) -> None:
    """Tell the daemon to quit, not waiting: it ends once its clients have (see the module docstring)."""
    quitter = subprocess.Popen([control], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    quitter.stdin.write("quit\n")
    quitter.stdin.close()
    QUITTERS.append(quitter)


PRIORITY_VALUES = {"normal": "0", "below_normal": "1"}
"""``async_rollout.actor_mps_priority`` -> ``CUDA_MPS_CLIENT_PRIORITY`` (NVIDIA's NORMAL 0, BELOW_NORMAL 1)."""


def actor_client_env(sm_percent: int, priority: str) -> Dict[str, str]:
    """The MPS client variables of the trainer's processes (``async_rollout.actor_sm_percent``,
    ``actor_mps_priority``): only those that differ from MPS's defaults (all the SMs, normal priority). A client
    reads them when it starts CUDA, so they go into the worker's environment at its start."""
    env = {}
    if sm_percent < 100:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(sm_percent)
    if priority != "normal":
        env["CUDA_MPS_CLIENT_PRIORITY"] = PRIORITY_VALUES[priority]
    return env


def shared_gpu_envs(share_devices: bool, device: str, sm_percent: int, priority: str,
                    environ: Mapping[str, str]) -> Tuple[Dict[str, str], Dict[str, str]]:
    """(the trainer's worker environment, the replicas') for a run: on a shared GPU both get the allocator's
    variables (``allocator_env``) and the trainer's processes also their MPS client limits; elsewhere neither gets
    anything (``environ``: the user's environment, whose ``PYTORCH_CUDA_ALLOC_CONF`` wins)."""
    from reasonrl.memory.shared_gpu import allocator_env

    both = allocator_env(share_devices, device, environ)
    limits = actor_client_env(sm_percent, priority) if share_devices and device == "cuda" else {}
    return {**both, **limits}, dict(both)


def client_variables(environ: Mapping[str, str]) -> Dict[str, str]:
    """The MPS client variables (``CUDA_MPS_*``) of an environment, by name."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith("CUDA_MPS_")}


def unused_limits_note(decision: Decision, actor_env: Mapping[str, str]) -> str:
    """The line a run on a local cluster prints when the trainer has MPS client limits but no daemon will run
    (``mps=auto`` without one): they would do nothing, and the user asked for them. (A run that joins a cluster is not
    told: its machines may run daemons of their own, which read the limits.)"""
    limits = list(client_variables(actor_env))
    if decision.action != "none" or not limits:
        return ""
    return (f"MPS: no daemon, so the trainer's {', '.join(limits)} does nothing (async_rollout.actor_sm_percent, "
            "actor_mps_priority)")


REFUSED = ("MPS client failed to connect", "cudaErrorMpsConnectionFailed")
"""What CUDA says (error 805) when an MPS daemon answers on the pipe directory but will not take the process."""


def refused_hint(error_text: str, environ: Mapping[str, str] = os.environ) -> str:
    """What to do, appended to a worker's failure, when the MPS daemon refused it; empty for any other failure. A
    daemon whose server was left broken by an earlier run (its replicas killed while they ran) refuses every new
    CUDA process on its pipe directory, whatever ``async_rollout.mps`` says, until its old clients are gone
    (thirtieth session: two benchmark runs failed so at their first CUDA call)."""
    if not any(phrase in error_text for phrase in REFUSED):
        return ""
    return (f" (the MPS daemon on {pipe_directory(environ)} refused this process. A daemon an earlier run left with "
            "a broken server refuses every new client until that run's processes are gone: find them with "
            f"nvidia-smi, end them, stop the daemon with `echo quit | {CONTROL}`, then start again)")


def control_binary() -> Optional[str]:
    return shutil.which(CONTROL)


def prepare_shared_gpu(mode: str, shared_gpu: bool, local_cluster: bool,
                       actor_env: Optional[Mapping[str, str]] = None) -> Decision:
    """Before Ray starts (``RayBackend.start``): ``decide``, then start the daemon (told to quit when this process
    exits) or refuse the run (``ConfigError``, naming ``async_rollout.mps``); the note is printed, and so is
    ``unused_limits_note`` for the trainer's environment ``actor_env``."""
    from reasonrl.config import ConfigError

    control = control_binary()
    decision = decide(mode, shared_gpu, local_cluster, control, shared_gpu and daemon_running(control))
    if decision.error:
        raise ConfigError(decision.error)
    for note in (decision.note, unused_limits_note(decision, actor_env or {}) if local_cluster else ""):
        if note:
            print(f"reasonrl: {note}", flush=True)
    if decision.action == "start":
        start_daemon(control)
        atexit.register(quit_daemon, control)
    return decision
