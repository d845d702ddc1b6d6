"""The rollout source: the one seam between the loop and whatever generates its responses.

``Trainer`` calls nothing of a source but these members (``tests/unit/trainer/test_rollout_source.py`` checks the loop's calls and
both implementations against this list). A step, in the loop's order:

    start(step)                       once, after a resume's ``load``: engines at the weights of ``step``
    next_round(step, timer)           the step's verified round (again for each DAPO refill)
    round_metrics()                   the source's own metrics of the step's round (async: staleness, waits)
    generate_verified(prompts, ...)   one response per prompt, verified: validation and ReMax's greedy baseline
    release_devices(timer)            before the update: engines on the trainer's devices give their memory up
    publish(version, timer)           after it: the actor's weights of ``version`` to the engines (None: not updated)
    check_weight_sync(prompt, resp)   ``rollout.check_weight_sync``: the engines' log-probs of a sequence vs the actor's
    save(directory) / load(directory) what the source holds beyond the workers' checkpoint (rounds generated ahead)
    close()

Implementations (``sources.py``), side by side: ``ColocatedSource`` (the engines inside the actor workers) and
``AsyncSource`` (rollout workers of their own, rounds generated ahead). A new one (a fleet of replicas, continuous
generation) implements these members and is chosen in ``sources.make_source``; the loop does not change.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol, Sequence, runtime_checkable

from reasonrl.data.sample import Round, Sample

from .metrics import PhaseTimer


@runtime_checkable
class RolloutSource(Protocol):
    """Where a step's round comes from and where the new weights go (see the module docstring)."""

    def start(self, step: int) -> None:
        """Make ready to serve step ``step``: the engines hold its weights (a resumed run's actor loaded them), the
        rounds a checkpoint held are back, rounds are started ahead where the source runs ahead."""

    def next_round(self, step: int, timer: PhaseTimer) -> Round:
        """The next ``data.train_batch_size`` prompts with ``rollout.n`` verified responses each, for step ``step``
        (0-based: the step about to train). Time spent waiting for it goes under ``timer``'s ``rollout``/``verify``."""

    def round_metrics(self) -> Dict[str, float]:
        """The source's own metrics of the last round ``next_round`` returned (empty when it has none)."""

    def generate_verified(self, prompts: Sequence[Any], sampling: Dict[str, Any]) -> List[Sample]:
        """One verified response per prompt, with ``sampling`` (validation; ReMax's greedy baseline), in order."""

    def release_devices(self, timer: PhaseTimer) -> None:
        """The update is next: engines that share the trainer's devices free their memory (a no-op for engines on
        devices of their own)."""

    def publish(self, version: Optional[int], timer: PhaseTimer) -> Dict[str, float]:
        """After the update: the actor's weights of ``version`` (the number of updates they include) to the engines;
        ``None``: nothing was updated, the engines keep their weights and take back what ``release_devices`` freed.
        Returns the sync's metrics (``weight_sync/bytes``)."""

    def check_weight_sync(self, prompt_ids: List[int], response_ids: List[int]) -> Dict[str, float]:
        """After ``publish`` (``rollout.check_weight_sync``): the engines' log-probs of ``response_ids`` after
        ``prompt_ids`` against the actor's (the fleet: every replica's, a stale one named in the error that stops the
        run). Returns the check's metrics."""

    def save(self, directory: str) -> None:
        """Into a checkpoint being written: what the source holds that the workers' checkpoint does not."""

    def load(self, directory: str) -> None:
        """From the checkpoint being resumed (before ``start``): what ``save`` wrote, if anything."""

    def close(self) -> None:
        """Stop what the source started (threads, its own workers)."""
