"""The fleet's per-replica weight-sync check (``fleet.weight_check``), numbers by hand: a replica off in its version or
in its log-probs is named; the worst replica is what ``weight_sync/logprob_diff_*`` report."""
from __future__ import annotations

import pytest

from reasonrl.fleet.weight_check import EXIT_STALE_REPLICA, StaleReplicaError, abs_diff, compare_replicas

ACTOR = [-1.0, -2.0, -0.5]


def test_a_healthy_fleet_passes_with_each_replicas_numbers():
    # replica0 exact; replica1 off by 0.01, 0.02, 0.03 -> max 0.03, mean 0.02
    diffs, m = compare_replicas(ACTOR, {"replica1": (3, [-1.01, -2.02, -0.53]), "replica0": (3, list(ACTOR))},
                                expected=3, bound=0.05)
    assert [d.replica for d in diffs] == ["replica0", "replica1"]
    assert m["fleet/weight_sync/replica0/mean_abs_diff"] == 0.0
    assert m["fleet/weight_sync/replica1/max_abs_diff"] == pytest.approx(0.03)
    assert m["fleet/weight_sync/replica1/mean_abs_diff"] == pytest.approx(0.02)
    assert m["fleet/weight_sync/replica1/version"] == 3.0 and m["fleet/weight_sync/replicas_checked"] == 2.0
    assert m["weight_sync/logprob_diff_max"] == pytest.approx(0.03)
    assert m["weight_sync/logprob_diff_mean"] == pytest.approx(0.02)


def test_a_replica_at_an_older_version_is_named_even_with_close_log_probs():
    with pytest.raises(StaleReplicaError, match=r"replica replica1 is stale after the weights of version 3 were "
                                                r"published: it holds version 2") as caught:
        compare_replicas(ACTOR, {"replica0": (3, list(ACTOR)), "replica1": (2, list(ACTOR))}, expected=3, bound=0.05)
    assert (caught.value.replica, caught.value.version, caught.value.expected) == ("replica1", 2, 3)
    assert caught.value.exit_status == EXIT_STALE_REPLICA == 5


def test_a_replica_at_the_version_but_off_past_the_bound_is_named():
    # replica0 off by 0.1 on every token: mean 0.1 > bound 0.05 though it reports the version
    with pytest.raises(StaleReplicaError, match=r"replica replica0 .* reports version 3 but its mean .* 0\.1 exceeds "
                                                r"fleet.weight_sync_max_diff=0\.05"):
        compare_replicas(ACTOR, {"replica0": (3, [-1.1, -2.1, -0.6]), "replica1": (3, list(ACTOR))}, expected=3,
                         bound=0.05)


def test_the_bound_is_on_the_mean_not_the_max():
    # one token off by 0.09, the others exact: max 0.09 > 0.05, mean 0.03 <= 0.05 -> passes
    _, m = compare_replicas(ACTOR, {"replica0": (1, [-1.09, -2.0, -0.5])}, expected=1, bound=0.05)
    assert m["fleet/weight_sync/replica0/max_abs_diff"] == pytest.approx(0.09)


def test_lists_of_other_lengths_are_refused():
    with pytest.raises(ValueError, match="equally long"):
        abs_diff([-1.0], [-1.0, -2.0])


def test_the_halted_exit_status_is_the_trainers():
    from reasonrl.trainer.failures import EXIT_HALTED

    assert EXIT_STALE_REPLICA == EXIT_HALTED
