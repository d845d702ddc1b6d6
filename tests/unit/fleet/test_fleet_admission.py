"""reasonrl/fleet/admission.py: admission bounds staleness by pacing, never by discarding.
Every expected batch, wait and lag below is worked out by hand from the rule in the module docstring: at published
version v a group joins the earliest batch j not full, only if j <= v + k; batch j is trained at version j."""
import random

import pytest

from reasonrl.fleet.admission import AdmissionController, AdmissionError


def test_k0_is_on_policy_only_the_next_batch_fills():
    c = AdmissionController(batch_size=2, max_staleness=0)
    # v=0: batch 0 is open (0 <= 0+0): a, b join it; batch 1 > 0+0 -> c waits
    assert c.admit("a") == 0 and c.admit("b") == 0
    assert c.admit("c") is None
    # b finishes before a: the batch lists them in finishing order
    c.finished("b", ok=True, tokens=10)
    assert c.take_batch() is None          # a still running: the trainer waits
    c.finished("a", ok=True, tokens=30)
    assert c.take_batch() == ["b", "a"]    # trained at version 0, started at 0: lag 0
    assert c.admit("c") is None            # taken 1 but still v=0: batch 1 > 0+0
    c.publish(1)
    assert c.admit("c") == 1 and c.admit("d") == 1
    assert c.admit("e") is None            # batch 2 > 1+0
    c.finished("c", ok=True, tokens=5)
    c.finished("d", ok=True, tokens=5)
    assert c.take_batch() == ["c", "d"]    # version 1, started at 1: lag 0
    assert dict(c.lag_groups) == {0: 4}
    assert dict(c.lag_tokens) == {0: 50}
    # refused calls: admit c, c, e (3); take_batch once
    m = c.metrics()
    assert m["admission/fleet_wait_calls"] == 3 and m["admission/trainer_wait_calls"] == 1
    assert m["admission/lag_groups/0"] == 4 and "admission/lag_groups/1" not in m


def test_k1_one_batch_ahead_and_out_of_order_batches_wait():
    c = AdmissionController(batch_size=2, max_staleness=1)
    # v=0: batches 0 and 1 (<= 0+1) open: a,b -> 0; c,d -> 1; e -> batch 2 > 1: wait
    assert [c.admit(g) for g in "abcde"] == [0, 0, 1, 1, None]
    c.finished("d", ok=True)
    c.finished("c", ok=True)               # batch 1 complete before batch 0
    assert c.in_flight == 2 and c.ready == 2
    assert c.take_batch() is None          # batch 0 first: the trainer waits for a, b
    c.finished("a", ok=True)
    c.finished("b", ok=True)
    assert c.take_batch() == ["a", "b"]    # version 0 - start 0: lag 0
    assert c.admit("e") is None            # v still 0: batch 2 > 0+1
    c.publish(1)
    assert c.admit("e") == 2 and c.admit("f") == 2 and c.admit("g") is None  # batch 3 > 1+1
    assert c.take_batch() == ["d", "c"]    # version 1 - start 0: lag 1
    c.finished("f", ok=True)
    c.finished("e", ok=True)
    c.publish(2)
    assert c.take_batch() == ["f", "e"]    # version 2 - start 1: lag 1
    assert dict(c.lag_groups) == {0: 2, 1: 4}
    assert c.in_flight == 0 and c.ready == 0


def test_k2_two_batches_ahead_lag_reaches_two_never_three():
    c = AdmissionController(batch_size=2, max_staleness=2)
    # v=0: batches 0, 1, 2 open (<= 0+2): 6 groups, the 7th waits
    assert [c.admit(g) for g in "abcdefg"] == [0, 0, 1, 1, 2, 2, None]
    for g in "fedcba":                     # all finish in reverse order
        c.finished(g, ok=True, tokens=1)
    assert c.take_batch() == ["b", "a"]    # version 0 - start 0: lag 0
    c.publish(1)
    # v=1: batches 1, 2 are full; batch 3 <= 1+2 is open: g, h; i -> batch 4 > 3: wait
    assert [c.admit(g) for g in "ghi"] == [3, 3, None]
    assert c.take_batch() == ["d", "c"]    # version 1 - start 0: lag 1
    c.publish(2)
    assert c.take_batch() == ["f", "e"]    # version 2 - start 0: lag 2
    assert c.admit("i") == 4 and c.admit("j") == 4   # v=2: batch 4 <= 2+2
    c.finished("g", ok=True, tokens=1)
    c.finished("h", ok=True, tokens=1)
    c.publish(3)
    assert c.take_batch() == ["g", "h"]    # version 3 - start 1: lag 2
    assert dict(c.lag_groups) == {0: 2, 1: 2, 2: 4}
    assert c.in_flight == 2                # i, j (batch 4) still running


def test_failed_group_frees_its_slot_for_a_new_prompt():
    c = AdmissionController(batch_size=2, max_staleness=1)
    assert [c.admit(g) for g in "abcd"] == [0, 0, 1, 1]
    assert c.admit("x") is None            # batches 0, 1 full, 2 > 0+1
    c.finished("a", ok=False)              # a fails (or is filtered): batch 0 has a hole
    assert c.open_batch() == 0
    assert c.admit("e") == 0               # the earliest hole, before any later batch
    c.finished("b", ok=True)
    assert c.take_batch() is None          # e still running
    c.finished("e", ok=True)
    assert c.take_batch() == ["b", "e"]
    assert c.failed == 1 and c.metrics()["admission/failed"] == 1
    with pytest.raises(AdmissionError, match="not running"):
        c.finished("a", ok=True)           # a failed group is gone
    assert c.admit("a") is None            # may come back as a new prompt when there is room
    c.publish(1)
    assert c.admit("a") == 2


def test_waits_in_seconds_from_given_timestamps():
    c = AdmissionController(batch_size=1, max_staleness=0)
    assert c.admit("a", now=0.0) == 0
    assert c.admit("b", now=1.0) is None    # the fleet waits from 1.0 ...
    assert c.admit("b", now=2.0) is None
    assert c.take_batch(now=3.0) is None    # the trainer waits from 3.0 ...
    c.finished("a", ok=True)
    assert c.take_batch(now=7.5) == ["a"]   # ... to 7.5: 4.5 s
    c.publish(1)
    assert c.admit("b", now=9.0) == 1       # ... to 9.0: 8 s
    assert c.take_batch(now=10.0) is None   # from 10.0 ...
    c.finished("b", ok=True)
    assert c.take_batch(now=11.0) == ["b"]  # ... to 11.0: 1 s more
    m = c.metrics()
    assert m["admission/fleet_wait_s"] == 8.0 and m["admission/fleet_wait_calls"] == 2
    assert m["admission/trainer_wait_s"] == 5.5 and m["admission/trainer_wait_calls"] == 2


def test_partial_rollout_versions_count_the_lag_from_the_oldest_token():
    c = AdmissionController(batch_size=1, max_staleness=2)
    assert [c.admit(g) for g in "abc"] == [0, 1, 2]
    c.finished("a", ok=True, tokens=4)
    assert c.take_batch() == ["a"]
    c.publish(1)
    # b started at 0 and its tokens span versions 0..1; c started at 0 but (a partial rollout) continued at 1 only
    c.finished("b", ok=True, tokens=6, versions=(0, 1))
    c.finished("c", ok=True, tokens=8, versions=(1, 1))
    assert c.take_batch() == ["b"]          # version 1 - oldest 0: lag 1
    c.publish(2)
    assert c.take_batch() == ["c"]          # version 2 - oldest 1: lag 1
    assert dict(c.lag_tokens) == {0: 4, 1: 14}
    assert c.admit("d") == 3
    with pytest.raises(AdmissionError, match="token versions"):
        c.finished("d", ok=True, versions=(1, 2))   # older than its start version 2


def test_protocol_errors_are_named():
    with pytest.raises(AdmissionError, match="max_staleness"):
        AdmissionController(batch_size=2, max_staleness=-1)
    with pytest.raises(AdmissionError, match="batch_size"):
        AdmissionController(batch_size=0, max_staleness=0)
    c = AdmissionController(batch_size=1, max_staleness=0)
    c.admit("a")
    with pytest.raises(AdmissionError, match="already admitted"):
        c.admit("a")
    with pytest.raises(AdmissionError, match="publish"):
        c.publish(1)                        # no batch taken yet: version 1 does not exist
    c.finished("a", ok=True)
    c.take_batch()
    c.publish(1)
    with pytest.raises(AdmissionError, match="publish"):
        c.publish(0)


def run_schedule(seed, batch_size, k, steps=120):
    """Random admit/finish/take/publish events, then a drain; an independent record of each group's start and
    training version: the versions the test itself published and the batches it took, never the controller's."""
    rng = random.Random(seed)
    c = AdmissionController(batch_size=batch_size, max_staleness=k)
    version, taken, next_id = 0, 0, 0
    started, trained, ok_groups, running = {}, {}, set(), []

    def take():
        nonlocal taken
        batch = c.take_batch()
        if batch is not None:
            assert len(batch) == batch_size and set(batch) <= ok_groups
            for g in batch:
                assert g not in trained
                trained[g] = taken          # batch `taken` is trained at version `taken`
            taken += 1
        return batch

    def admit():
        nonlocal next_id
        if c.admit(next_id) is None:
            return False
        started[next_id] = version
        running.append(next_id)
        next_id += 1
        return True

    def finish(ok):
        g = running.pop(rng.randrange(len(running)))   # long groups finish late: any order
        c.finished(g, ok=ok)
        if ok:
            ok_groups.add(g)

    for _ in range(steps):
        event = rng.random()
        if event < 0.4:
            admit()
        elif event < 0.7 and running:
            finish(ok=rng.random() < 0.8)
        elif event < 0.85:
            take()
        elif version < taken:
            version = rng.randint(version + 1, taken)    # a trainer may publish late, never early
            c.publish(version)
    # drain: every running group finishes ok; holes left by failures are refilled by new prompts
    while running or c.ready:
        while running:
            finish(ok=True)
        while take() is not None:
            pass
        if version < taken:
            version = taken
            c.publish(version)
        while c.ready and c.open_batch() == taken and admit():   # fill the holes of the next batch only
            pass
    return started, trained, ok_groups


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_no_group_trained_beyond_k_and_none_dropped_over_random_schedules(k):
    lags = set()
    for seed in range(125):                # 4 x 125 = 500 seeded schedules
        started, trained, ok_groups = run_schedule(seed, batch_size=1 + seed % 3, k=k)
        assert set(trained) == ok_groups, seed   # every group that finished ok is trained, none twice
        for g, version in trained.items():
            lag = version - started[g]
            assert 0 <= lag <= k, (seed, g, lag)
            lags.add(lag)
    assert lags == set(range(k + 1))       # the schedules do reach every lag up to k


def test_no_discard_bias_long_groups_are_trained_not_dropped():
    # B=2, k=1. Each batch has one long group (L*) and one short (S*); the short ones always finish first. A discard
    # policy would drop the long ones as late; admission makes the trainer wait for them instead.
    c = AdmissionController(batch_size=2, max_staleness=1)
    assert [c.admit(g) for g in ["L0", "S0", "L1", "S1"]] == [0, 0, 1, 1]
    c.finished("S0", ok=True, tokens=10)
    c.finished("S1", ok=True, tokens=10)
    assert c.take_batch() is None          # not a batch of shorts: batch 0 waits for L0
    c.finished("L0", ok=True, tokens=1000)
    assert c.take_batch() == ["S0", "L0"]  # lag 0
    c.publish(1)
    assert [c.admit(g) for g in ["L2", "S2"]] == [2, 2]
    c.finished("S2", ok=True, tokens=10)
    assert c.take_batch() is None          # batch 1 waits for L1
    c.finished("L1", ok=True, tokens=1000)
    assert c.take_batch() == ["S1", "L1"]  # version 1 - start 0: lag 1
    c.finished("L2", ok=True, tokens=1000)
    c.publish(2)
    assert c.take_batch() == ["S2", "L2"]  # version 2 - start 1: lag 1
    # all three long groups (3000 of the 3030 tokens) are trained, none lost for finishing late
    assert dict(c.lag_groups) == {0: 2, 1: 4}
    assert dict(c.lag_tokens) == {0: 1010, 1: 2020}
    assert c.trainer_wait.calls == 2


def test_a_resumed_run_starts_at_its_step():
    """Resumed at step 3 with B = 2, k = 1: batches 3 and 4 may be filled at version 3, batch 5 not; batch 3 is the
    next taken, at lag 0 for groups started at 3."""
    adm = AdmissionController(batch_size=2, max_staleness=1)
    adm.start_at(3)
    assert [adm.admit(g) for g in "abcde"] == [3, 3, 4, 4, None]
    for g in "ab":
        adm.finished(g, ok=True, tokens=5)
    assert adm.take_batch() == ["a", "b"] and adm.lag_groups[0] == 2 and adm.taken == 4
    with pytest.raises(AdmissionError, match="start_at after admissions began"):
        adm.start_at(1)
