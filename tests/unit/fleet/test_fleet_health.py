"""reasonrl/fleet/health.py: dead, hung and failing replicas, the watchdog's clock and the restart budget. Times are
given by hand (the module takes the clock as an argument)."""
import pytest

from reasonrl.fleet.health import EXIT_FLEET_SPENT, FleetHealth, HealthPolicy, RestartBudgetSpent


def watch(*names, failures=3, watchdog=10.0, budget=2):
    health = FleetHealth(HealthPolicy(max_consecutive_failures=failures, watchdog_s=watchdog, restart_budget=budget))
    for name in names:
        health.add(name)
    return health


def test_the_watchdog_counts_from_the_last_answer_or_from_going_busy():
    health = watch("a", "b")
    health.sent("a", now=100.0)         # a busy from 100
    health.sent("a", now=105.0)         # still from 100: it was already busy
    assert health.verdicts(now=109.9) == []
    health.answered("a", now=109.95)    # one answer: the clock restarts there, one request left
    assert health.verdicts(now=110.0) == []
    health.sent("b", now=110.0)         # b busy from 110
    assert health.verdicts(now=119.9) == []
    slow = "raise fleet.watchdog_s if one engine step, or a call's work after its last step, can take longer"
    assert health.verdicts(now=120.0) == [("a", "hung: 1 request(s) outstanding, no answer and no engine step seen "
                                                f"for 10 s (watchdog 10 s; {slow})"),
                                          ("b", "hung: 1 request(s) outstanding, no answer and no engine step seen "
                                                f"for 10 s (watchdog 10 s; {slow})")]
    health.answered("b", now=120.0)
    health.answered("a", now=120.5)     # idle: never hung, however long
    assert health.verdicts(now=10_000.0) == []
    health.sent("a", now=10_000.0)      # busy again: from 10000, not from the last answer at 120.5
    assert health.verdicts(now=10_009.0) == []
    assert health.verdicts(now=10_010.0)[0][0] == "a"


def test_consecutive_failures_reset_by_a_success():
    health = watch("a", failures=3)
    for t in range(6):
        health.sent("a", now=float(t))
    health.answered("a", 1.0, error="500")
    health.answered("a", 2.0, error="500")
    health.answered("a", 3.0)           # a success: the count starts over
    health.answered("a", 4.0, error="timeout")
    health.answered("a", 5.0, error="timeout")
    assert health.verdicts(now=5.0) == []
    health.answered("a", 5.5, error="connection reset")
    assert health.verdicts(now=5.5) == [("a", "failing: 3 failed requests in a row, the last: connection reset")]


def test_a_dead_replica_is_replaced_and_the_budget_then_stops_the_run():
    health = watch("a", "b", "c", budget=2)
    health.sent("b", now=0.0)
    health.died("b", "SIGKILL")
    assert health.verdicts(now=0.0) == [("b", "died: SIGKILL")]
    assert health.metrics()["fleet/replicas_alive"] == 2.0
    health.restart("b", "died: SIGKILL")               # restart 1 of 2: a fresh record under the same name
    assert health.verdicts(now=1e6) == [] and health.replicas["b"].restarts == 1
    assert health.metrics() == {"fleet/replicas": 3.0, "fleet/replicas_alive": 3.0, "fleet/restarts": 1.0,
                                "fleet/outstanding/a": 0.0, "fleet/outstanding/b": 0.0, "fleet/outstanding/c": 0.0}
    health.restart("c", "hung")                        # restart 2 of 2
    with pytest.raises(RestartBudgetSpent) as spent:   # the third
        health.restart("a", "failing: 3 failed requests in a row")
    assert str(spent.value) == ("fleet: replica a must be replaced (failing: 3 failed requests in a row) but the "
                                "run's restart budget of 2 is spent")
    assert spent.value.exit_status == EXIT_FLEET_SPENT == 6 and spent.value.replica == "a"
    assert health.restarts == 2


def test_a_budget_of_zero_stops_at_the_first_restart():
    health = watch("a", budget=0)
    with pytest.raises(RestartBudgetSpent, match="replica a must be replaced \\(died: exit 1\\)"):
        health.restart("a", "died: exit 1")


def test_bad_policies_and_calls_are_refused_by_name():
    with pytest.raises(ValueError, match="restart_budget=-1 \\(0 or more\\)"):
        HealthPolicy(restart_budget=-1)
    with pytest.raises(ValueError, match="max_consecutive_failures=0 .*watchdog_s=0"):
        HealthPolicy(max_consecutive_failures=0, watchdog_s=0)
    health = watch("a")
    with pytest.raises(ValueError, match="answered with no request outstanding"):
        health.answered("a", 0.0)
    with pytest.raises(KeyError, match="no replica 'z' is watched"):
        health.sent("z", 0.0)


def test_an_engine_that_moves_is_not_hung_and_one_that_stops_is():
    health = watch("a")                 # watchdog 10 s
    health.sent("a", now=100.0)
    health.progressed("a", 0, now=109.0)  # a new engine's count: no step yet, no progress
    assert [name for name, _ in health.verdicts(now=110.0)] == ["a"]
    health.progressed("a", 40, now=110.0)  # 40 steps since: the call is long, not stuck; the clock restarts at 110
    assert health.verdicts(now=119.9) == []
    health.progressed("a", 40, now=120.0)  # no step since 110: hung at 120, 20 s after the start, 10 s after the last
    assert [name for name, _ in health.verdicts(now=120.0)] == ["a"]
    health.answered("a", now=121.0)     # idle: steps seen keep nothing running
    health.progressed("a", 55, now=500.0)
    assert health.verdicts(now=10_000.0) == []
    health.sent("a", now=10_000.0)      # busy again: 55 steps are the baseline, so 55 is no progress
    health.progressed("a", 55, now=10_010.0)
    assert [name for name, _ in health.verdicts(now=10_010.0)] == ["a"]
    health.restart("a", "hung")         # the new engine counts from 0 again
    health.sent("a", now=20_000.0)
    health.progressed("a", 3, now=20_009.0)
    assert health.verdicts(now=20_018.0) == []  # 3 steps moved the clock to 20009
