"""The replicas' heartbeats: each replica's engine steps in all, as the replica last reported them. A replica answers
only when a whole ``generate`` call ends, and one call may hold several batches of long responses, so the watchdog
(``health.FleetHealth.progressed``) tells a long call from a stuck one by these counts. The replicas send them from a
thread of their own (``RolloutWorker.watch_progress``) to one ``ProgressBoard`` the fleet runs as a small Ray actor
(``trainer.replicas.Replicas``), so that reading them never waits behind a replica's running call."""
from __future__ import annotations

from typing import Dict


class ProgressBoard:
    """Engine steps by replica rank (see the module docstring)."""

    def __init__(self) -> None:
        self.steps: Dict[int, int] = {}

    def beat(self, rank: int, engine_steps: int) -> None:
        self.steps[rank] = engine_steps

    def forget(self, rank: int) -> None:
        """A replaced replica's count (its successor's engine starts at 0)."""
        self.steps.pop(rank, None)

    def read(self) -> Dict[int, int]:
        return dict(self.steps)

    def close(self) -> None:
        """The board's actor exits: the caller of this method sees the actor die, and every later call fails
        (``ray.actor.exit_actor``)."""
        import ray

        ray.actor.exit_actor()
