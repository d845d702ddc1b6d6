"""The ``async_rollout`` and ``fleet`` sections: rollouts generated off the actor's devices, by rollout workers of their
own (docs/async.md) and, with ``fleet.enabled``, by a self-healing fleet of them (docs/fleet.md). One docstring per
field; ``docs/configuration.md`` is generated from these with ``schema.py`` (``python -m reasonrl.config.docs``)."""
from __future__ import annotations

from dataclasses import dataclass

MPS_MODES = ("auto", "required", "disabled")
"""``async_rollout.mps``'s values (not on/off: YAML reads those as booleans)."""
MPS_PRIORITIES = ("normal", "below_normal")
"""``async_rollout.actor_mps_priority``'s values: MPS's client priorities 0 and 1 (``CUDA_MPS_CLIENT_PRIORITY``)."""


@dataclass
class AsyncRolloutConfig:
    """``trainer.mode=async``: rollout workers on their own devices, generating ahead of training (docs/async.md)."""

    num_rollout_workers: int = 1
    """Rollout workers (one device each); the actor group gets the other devices (or ``trainer.num_workers``)."""
    max_staleness: int = 1
    """Most policy versions between the weights that generated a batch and the weights that train on it
    (``async/staleness``): 1 is one-step-off (the engines generate step k+1 while the actor trains step k), 0 runs
    generation and training in turn on their own devices."""
    transfer_timeout_s: float = 600.0
    """Timeout of one collective of the actor-to-rollout weight transfer group (NCCL/gloo)."""
    share_devices: bool = False
    """Place the rollout replicas on the actor's devices instead of devices of their own: replica r shares actor rank
    r's GPU (one placement-group bundle, half a Ray GPU each), its engine awake while the actor trains (no sleep
    between phases), so one GPU overlaps generation with training. The actor gets every GPU;
    ``num_rollout_workers`` must be a multiple m of the actor ranks: m replicas on each rank's GPU (replica r on rank
    r mod ranks; the bundle split in m + 1 equal Ray shares), so that a group admitted while one replica's call
    decodes its longest responses can start on another; needs ``fleet.enabled`` (weights through Ray's object store:
    NCCL refuses two ranks on one GPU). On a CPU the replicas share the cores, as in plain async mode (docs/async.md,
    "The same GPU for both")."""
    mps: str = "auto"
    """With ``share_devices`` on a GPU: NVIDIA's Multi-Process Service, so the actor's and the replica's kernels run
    side by side instead of taking turns on the GPU (on one H100: 1.30x colocated under MPS, 0.82x time-sliced;
    docs/async.md). ``auto``: start ``nvidia-cuda-mps-control -d`` before the workers when it is on PATH and no
    daemon runs (a local cluster only), use one that runs, else say that the GPU will be time-sliced; ``required``:
    the same, but refuse to start without a daemon; ``disabled``: leave the GPU as it is
    (``reasonrl/controller/mps.py``)."""
    actor_sm_percent: int = 100
    """With ``share_devices`` under MPS: the percentage of each shared GPU's SMs the trainer's kernels may use at
    once (NVIDIA's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, set in the actor's and the critic's processes before they
    start CUDA), so the replicas' decode steps find SMs free while the update runs; 100: no limit. **Only 100 is
    accepted for now**: at 60 the actor's update alone, with no replica beside it, had a NaN gradient norm and loss
    on an H100 (torch 2.11, CUDA 13.0), where the same update with no limit, with or without MPS, was finite; a
    training run at 60 halted after 3 non-finite updates (docs/async.md, "The thirty-third session's lease";
    ``benchmarks/gpu_cap_locate.py`` looks for the operation). In a torch probe on one H100 a decode-like client
    beside a saturating trainer-like one kept 0.82 of its speed alone at 60 (0.145 with no limit), the trainer
    0.49 (docs/async.md, "The thirty-first session's lease")."""
    actor_mps_priority: str = "normal"
    """With ``share_devices`` under MPS: the trainer's processes as MPS clients of ``normal`` priority or
    ``below_normal`` (NVIDIA's ``CUDA_MPS_CLIENT_PRIORITY`` 0 or 1), so that the GPU schedules the replicas' kernels
    first while both have work; not yet measured."""
    engine_memory_fraction: float = 0.3
    """With ``share_devices``: the share of each shared GPU's memory each replica's vLLM engine takes (its
    ``gpu_memory_utilization``, in place of ``rollout.gpu_memory_utilization``: weights, then KV cache); with m
    replicas on a GPU they take m times this, the trainer the rest. The memory plan checks them all together before
    anything loads."""


@dataclass
class FleetConfig:
    """``trainer.mode=async``'s rollout workers as a self-healing fleet of replicas (docs/fleet.md)."""

    enabled: bool = False
    """Serve rounds through the fleet: prompts routed to the ``async_rollout.num_rollout_workers`` replicas, a dead
    replica replaced and its prompts issued again, every prompt in the ledger (needs ``trainer.mode=async``)."""
    max_restarts: int = 2
    """Replicas the run may replace in all; the next one the fleet would need to replace stops the run."""
    watchdog_s: float = 300.0
    """Seconds a replica with requests outstanding may go without answering and without an engine step (its
    heartbeat, docs/fleet.md) before it is replaced as hung."""
    weight_sync_max_diff: float = 0.1
    """With ``rollout.check_weight_sync``: the largest mean |replica - actor| log-prob difference (nats, over the
    probe sequence's tokens) a replica may show after a publish; above it, or at a weight version other than the
    published one, the replica is stale and the run stops naming it (docs/fleet.md). Engine noise is ~1e-6 in float32
    on CPU; bf16 engines on a GPU differ more (not measured for the fleet yet)."""
    continuous: bool = False
    """Generate all the time (docs/async.md, Continuous generation): the replicas start prompts as soon as admission
    lets them, and a prompt starts only if it will be trained within ``async_rollout.max_staleness`` versions of the
    weights that start it (pacing, not discarding). false: each round is generated when its step asks for it."""
