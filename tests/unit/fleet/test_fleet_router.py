"""reasonrl/fleet/router.py: least outstanding work, sticky groups and trajectories, round-robin, drain/remove/add.
Every expected assignment below is worked out by hand from the rules in the module docstring."""
import pytest

from reasonrl.fleet.router import NoReplicaError, RouteRequest, Router


def req(rid, group=None, trajectory=None, prompt=0, new=0, n=1):
    return RouteRequest(str(rid), group=group, trajectory=trajectory, prompt_tokens=prompt, max_new_tokens=new, n=n)


def fleet(*names, policy="least_outstanding", load="tokens"):
    router = Router(policy, load)
    for name in names:
        router.add(name)
    return router


def test_least_outstanding_tokens_with_given_loads():
    # a: 100 tokens outstanding, b: 40, c: 70 -> a new request of 10 tokens goes to b (40 < 70 < 100)
    router = fleet("a", "b", "c")
    router.assign(req("la", prompt=100))
    router.assign(req("lb", prompt=40))
    router.assign(req("lc", prompt=70))
    assert [router.outstanding(n) for n in "abc"] == [100, 40, 70]
    assert router.assign(req(1, prompt=10)) == "b"          # b: 50
    assert router.assign(req(2, prompt=10)) == "b"          # b: 60
    assert router.assign(req(3, prompt=5, new=10, n=2)) == "b"  # b: 60 < 70 -> b: 60 + 5 + 20 = 85
    assert router.outstanding("b") == 85
    assert router.assign(req(4, prompt=1)) == "c"           # c: 70 < 85 < 100 -> c: 71
    assert router.complete("la")                            # a: 0
    assert router.assign(req(5, prompt=1)) == "a"


def test_ties_go_to_the_earliest_added_and_requests_load_counts_requests():
    router = fleet("x", "y", "z", load="requests")
    # all at 0 -> x; then y (x 1, y 0, z 0); then z; then x again (1, 1, 1)
    assert [router.assign(req(i, prompt=1000 * i)) for i in range(4)] == ["x", "y", "z", "x"]
    assert [router.outstanding(n) for n in "xyz"] == [2, 1, 1]


def test_among_narrows_the_choice_while_one_of_them_takes_work():
    router = fleet("a", "b", "c", load="requests")
    assert router.assign(req("busy_b"), among=["b"]) == "b"  # a 0, b 1, c 0
    # least outstanding overall is a (0, the earliest added); among b and c it is c, then b (1, 1 -> b earlier)
    assert router.assign(req(1), among=["b", "c"]) == "c"
    assert router.assign(req(2), among=["b", "c"]) == "b"
    router.drain("b")
    router.drain("c")
    assert router.assign(req(3), among=["b", "c"]) == "a"  # none of them takes work: all the open replicas
    assert router.assign(req(4), among=[]) == "a"
    router.add("d")
    router.assign(req("g1", group="g"), among=["a"])  # a group sticks where it went, whatever among says
    assert router.assign(req("g2", group="g"), among=["d"]) == "a"


def test_the_samples_of_one_prompt_go_to_one_replica():
    router = fleet("a", "b")
    # group g's first request -> a (tie); b is then lighter, but g's other samples stay on a; h goes to b
    assert [router.assign(req(f"g{i}", group="g", prompt=50)) for i in range(4)] == ["a"] * 4
    assert router.assign(req("h0", group="h", prompt=50)) == "b"
    assert router.assign(req("h1", group="h", prompt=50)) == "b"


def test_round_robin_ignores_groups_and_loads():
    router = fleet("a", "b", "c", policy="round_robin")
    got = [router.assign(req(i, group="g", prompt=10)) for i in range(5)]
    assert got == ["a", "b", "c", "a", "b"]


def test_a_trajectory_stays_on_the_replica_of_its_last_turn():
    router = fleet("a", "b", "c")
    router.assign(req("busy-a", prompt=500))
    router.assign(req("busy-b", prompt=10))
    # t1's first turn: c is the lightest (0); turn 2: c is the heaviest then, but the trajectory stays on c
    assert router.assign(req("t1.0", trajectory="t1", prompt=600)) == "c"
    router.complete("t1.0")
    router.assign(req("busy-c", prompt=900))                 # c (0) is the lightest: c 900, a 500, b 10
    assert router.assign(req("t1.1", trajectory="t1", prompt=700)) == "c"


def test_stickiness_survives_a_drain_the_trajectory_moves_once():
    router = fleet("a", "b", "c")
    router.assign(req("la", prompt=30))
    router.assign(req("lb", prompt=20))
    assert router.assign(req("t.0", trajectory="t", prompt=5)) == "c"  # c: 0 is the lightest
    router.complete("t.0")
    router.drain("c")
    # c takes no work: turn 1 moves to the lightest open replica, b (20 < 30), and is remembered there
    assert router.assign(req("t.1", trajectory="t", prompt=5)) == "b"
    assert router.moved_keys == 1
    router.complete("t.1")
    router.assign(req("lb2", prompt=100))  # b: 120 now, a: 30 -- still the trajectory stays on b
    assert router.assign(req("t.2", trajectory="t", prompt=5)) == "b"
    assert router.moved_keys == 1
    assert router.accepting() == ["a", "b"]


def test_a_drained_replica_finishes_its_requests_and_remove_hands_back_the_rest():
    router = fleet("a", "b")
    assert router.assign(req(1, prompt=10)) == "a"
    assert router.assign(req(2, prompt=10)) == "b"
    assert router.assign(req(3, group="g", prompt=10)) == "a"   # a 10 = b 10: the earlier, a
    router.drain("a")
    assert router.complete("1")                              # a drained replica's answer still counts
    assert router.assign(req(4, prompt=1)) == "b"            # a ties b (10, 10) and came first, but is drained
    lost = router.remove("a")
    assert [r.request_id for r in lost] == ["3"]
    assert not router.complete("3")                          # a late answer from the removed replica is dropped
    assert router.replicas() == ["b"]
    router.add("c")
    assert router.assign(req(5, prompt=1)) == "c"            # c: 0 < b: 11
    assert router.assign(req(6, group="g", prompt=1)) == "c"  # g's replica is gone: g moves to c (1 < 11)
    assert router.assign(req(7, group="g", prompt=50)) == "c" and router.moved_keys == 1


def test_slower_replica_gets_less_work_under_least_outstanding_not_under_round_robin():
    # closed loop, one unit per request: after every two assignments the fast replica f has finished everything it
    # holds, the slow one s only one request every third round.
    def run(policy):
        router = fleet("f", "s", policy=policy, load="requests")
        held = {"f": [], "s": []}
        rid = 0
        for rnd in range(6):
            for _ in range(2):
                rid += 1
                held[router.assign(req(rid))].append(str(rid))
            for done in held["f"]:
                assert router.complete(done)
            held["f"] = []
            if rnd % 3 == 2 and held["s"]:
                assert router.complete(held["s"].pop(0))
        return router.assigned("f"), router.assigned("s")

    # least_outstanding (outstanding f, s before each assignment; a tie goes to f, added first):
    # round 0: f (0, 0), s (1, 0); f finishes -> (0, 1). rounds 1 and 2: f (0, 1), f (1, 1 tie); s finishes its one
    # in round 2 -> (0, 0). round 3: f (0, 0), s (1, 0). rounds 4 and 5: f, f (s holds 1 until round 5).
    # f: 1 + 2 + 2 + 1 + 2 + 2 = 10, s: 2. round_robin alternates f, s whatever the loads: 6 and 6.
    assert run("least_outstanding") == (10, 2)
    assert run("round_robin") == (6, 6)


def test_refusals():
    router = fleet("a")
    router.assign(req(1))
    with pytest.raises(ValueError, match="already in flight"):
        router.assign(req(1))
    router.drain("a")
    with pytest.raises(NoReplicaError, match="no replica takes work"):
        router.assign(req(2))
    with pytest.raises(ValueError, match="already in the router"):
        router.add("a")
    with pytest.raises(KeyError, match="no replica 'q'"):
        router.drain("q")
    with pytest.raises(ValueError, match="router policy 'random'"):
        Router("random")
