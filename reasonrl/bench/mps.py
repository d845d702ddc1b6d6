"""The GPU placement of ``benchmarks/gpu_async_step.py``'s same-GPU mode (issue #48 item 4: which placement serves
best). Without ``--mps`` the actor and its replica, two processes on one GPU, are time-sliced by the driver; with it,
NVIDIA's MPS daemon runs their kernels side by side (``reasonrl/controller/mps.py``, which a training run uses through
``async_rollout.mps``). The benchmark turns that key off and starts the daemon itself, so that the colocated mode
runs without it and ``--mps`` is the one switch."""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Mapping

from reasonrl.controller.mps import CONTROL, client_variables, control_binary, quit_daemon, start_daemon


@contextmanager
def gpu_placement(mps: bool, on_gpu: bool) -> Iterator[str]:
    """``"mps"`` with the daemon up for the block (told to quit after it, also on an error), else ``"time-slicing"``.
    Refuses ``mps`` without a GPU or without the control binary, naming what is missing."""
    if not mps:
        yield "time-slicing"
        return
    control = control_binary()
    if not on_gpu or control is None:
        raise RuntimeError(f"--mps needs a CUDA GPU and {CONTROL} on PATH (GPU: {on_gpu}, {CONTROL}: "
                           f"{control or 'not found'})")
    start_daemon(control)
    try:
        yield "mps"
    finally:
        quit_daemon(control)


def mps_client_env(_worker: Any = None, environ: Mapping[str, str] = os.environ) -> Dict[str, str]:
    """The ``CUDA_MPS_*`` variables a process runs with (what CUDA reads when it starts as an MPS client: the
    trainer's ``async_rollout.actor_sm_percent`` and ``actor_mps_priority``). Called in each worker through Ray's
    ``__ray_call__`` (``_worker``: the actor instance it passes), so the JSON shows which process got which limits."""
    return client_variables(environ)
