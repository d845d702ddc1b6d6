"""The ``async_rollout`` and ``fleet`` sections: rollouts generated off the actor's devices, by rollout workers of their
own (docs/async.md) and, with ``fleet.enabled``, by a self-healing fleet of them (docs/fleet.md). One docstring per
field; ``docs/configuration.md`` is generated from these with ``schema.py`` (``python -m reasonrl.config.docs``)."""
from __future__ import annotations

from dataclasses import dataclass


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


@dataclass
class FleetConfig:
    """``trainer.mode=async``'s rollout workers as a self-healing fleet of replicas (docs/fleet.md)."""

    enabled: bool = False
    """Serve rounds through the fleet: prompts routed to the ``async_rollout.num_rollout_workers`` replicas, a dead
    replica replaced and its prompts issued again, every prompt in the ledger (needs ``trainer.mode=async``)."""
    max_restarts: int = 2
    """Replicas the run may replace in all; the next one the fleet would need to replace stops the run."""
    watchdog_s: float = 300.0
    """Seconds a replica with requests outstanding may go without answering before it is replaced as hung."""
    continuous: bool = False
    """Generate all the time (docs/async.md, Continuous generation): the replicas start prompts as soon as admission
    lets them, and a prompt starts only if it will be trained within ``async_rollout.max_staleness`` versions of the
    weights that start it (pacing, not discarding). false: each round is generated when its step asks for it."""
