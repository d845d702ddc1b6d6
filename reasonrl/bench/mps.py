"""The GPU placement of ``benchmarks/gpu_async_step.py``'s same-GPU mode (issue #48 item 4: which placement serves
best). Without ``--mps`` the actor and its replica, two processes on one GPU, are time-sliced by the driver; with it,
NVIDIA's MPS daemon (``nvidia-cuda-mps-control``, on the H200 image) runs their kernels side by side. Every CUDA
process started while the daemon runs is its client, so the daemon starts before Ray and stops after it."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from typing import Iterator, List

CONTROL = "nvidia-cuda-mps-control"
QUITTERS: List[subprocess.Popen] = []
"""The ``quit`` senders started (the tests wait for them)."""


@contextmanager
def gpu_placement(mps: bool, on_gpu: bool) -> Iterator[str]:
    """``"mps"`` with the daemon up for the block (stopped after it, also on an error), else ``"time-slicing"``.
    Refuses ``mps`` without a GPU or without the control binary, naming what is missing."""
    if not mps:
        yield "time-slicing"
        return
    control = shutil.which(CONTROL)
    if not on_gpu or control is None:
        raise RuntimeError(f"--mps needs a CUDA GPU and {CONTROL} on PATH (GPU: {on_gpu}, {CONTROL}: "
                           f"{control or 'not found'})")
    # the daemon's pipe and log folders: /tmp's unless set (its defaults under /var/log need root); the daemon and
    # every client started later (Ray's workers inherit this process's environment) must agree on the pipe
    for var, sub in (("CUDA_MPS_PIPE_DIRECTORY", "pipe"), ("CUDA_MPS_LOG_DIRECTORY", "log")):
        os.makedirs(os.environ.setdefault(var, os.path.join(tempfile.gettempdir(), "reasonrl-mps", sub)),
                    exist_ok=True)
    subprocess.run([control, "-d"], stdin=subprocess.DEVNULL, check=True, timeout=30)
    try:
        yield "mps"
    finally:
        # not waited for: the daemon quits once its clients have, and this process is one of them (it starts CUDA
        # inside the block), so waiting here would never end; the quitter runs on in a session of its own
        quitter = subprocess.Popen([control], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        quitter.stdin.write("quit\n")
        quitter.stdin.close()
        QUITTERS.append(quitter)
