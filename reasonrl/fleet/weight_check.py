"""The fleet's weight-sync check (``rollout.check_weight_sync`` with ``fleet.enabled``; docs/fleet.md): after a
publish, every replica scores the same probe tokens with the weights it holds, and each replica's log-probs are
compared with the actor's. A replica is stale when it reports a weight version other than the one published, or when
its mean |replica - actor| over the probe's tokens exceeds ``fleet.weight_sync_max_diff`` (it reports the version
but holds other weights: a load that did not land). Pure: no torch, no Ray.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Sequence, Tuple

EXIT_STALE_REPLICA = 5
"""``reasonrl.train``'s exit status when a stale replica stops the run: a halted run's
(``trainer.failures.EXIT_HALTED``)."""


@dataclass(frozen=True)
class ReplicaDiff:
    """One replica's answer to the probe against the actor's log-probs."""

    replica: str
    version: int
    """The weight version the replica reports it holds."""
    max_abs: float
    mean_abs: float


class StaleReplicaError(RuntimeError):
    """A replica does not hold the published weights (see the module docstring); names it and its version."""

    exit_status = EXIT_STALE_REPLICA

    def __init__(self, stale: ReplicaDiff, expected: int, bound: float, checked: Sequence[ReplicaDiff]) -> None:
        self.replica, self.version, self.expected, self.bound = stale.replica, stale.version, expected, bound
        self.checked = list(checked)
        why = (f"it holds version {stale.version}" if stale.version != expected
               else f"it reports version {stale.version} but its mean |replica - actor| log-prob difference "
                    f"{stale.mean_abs:.3g} exceeds fleet.weight_sync_max_diff={bound:g}")
        super().__init__(f"fleet: replica {stale.replica} is stale after the weights of version {expected} were "
                         f"published: {why} (its probe log-probs: max |replica - actor| {stale.max_abs:.3g}, mean "
                         f"{stale.mean_abs:.3g}); it would generate with old weights")


class UncheckedReplicaError(RuntimeError):
    """A replica hung or raised in the check, and so did its replacement: the check cannot say what it holds. Names
    the replica and the cause; ends the run with the stale replica's exit status."""

    exit_status = EXIT_STALE_REPLICA

    def __init__(self, replica: str, cause: str) -> None:
        self.replica, self.cause = replica, cause
        super().__init__(f"fleet: replica {replica} could not be checked after the weights were published: it "
                         f"{cause}, and so did the replacement that took its place")


def abs_diff(a: Sequence[float], b: Sequence[float]) -> Tuple[float, float]:
    """(max, mean) of |a - b| over two equally long, non-empty lists."""
    if len(a) != len(b) or not a:
        raise ValueError(f"log-prob lists must be equally long and non-empty, got {len(a)} and {len(b)}")
    diffs = [abs(float(x) - float(y)) for x, y in zip(a, b)]
    return max(diffs), sum(diffs) / len(diffs)


def compare_replicas(actor: Sequence[float], replicas: Mapping[str, Tuple[int, Sequence[float]]], expected: int,
                     bound: float) -> Tuple[List[ReplicaDiff], Dict[str, float]]:
    """Each replica's (reported version, probe log-probs) against the actor's ``actor`` log-probs of the weights of
    ``expected``: the diffs, in replica order, and the metrics (``fleet/weight_sync/<replica>/max_abs_diff``,
    ``.../mean_abs_diff``, ``.../version``; ``weight_sync/logprob_diff_max``/``_mean``: the worst replica's, as the
    colocated check reports its engine's). Raises ``StaleReplicaError`` naming the first stale replica."""
    diffs = [ReplicaDiff(name, int(version), *abs_diff(lps, actor))
             for name, (version, lps) in sorted(replicas.items())]
    metrics: Dict[str, float] = {}
    for d in diffs:
        prefix = f"fleet/weight_sync/{d.replica}"
        metrics.update({f"{prefix}/max_abs_diff": d.max_abs, f"{prefix}/mean_abs_diff": d.mean_abs,
                        f"{prefix}/version": float(d.version)})
    if diffs:
        metrics["weight_sync/logprob_diff_max"] = max(d.max_abs for d in diffs)
        metrics["weight_sync/logprob_diff_mean"] = max(d.mean_abs for d in diffs)
    metrics["fleet/weight_sync/replicas_checked"] = float(len(diffs))
    for d in diffs:
        if d.version != expected or d.mean_abs > bound:
            raise StaleReplicaError(d, expected, bound, diffs)
    return diffs, metrics
