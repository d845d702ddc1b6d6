"""``fleet.poison``: a poison prompt told apart from a broken replica (pure; expectations derived by hand from the
rules in the module docstring: a raised call's prompts go again alone, off the replica; a prompt raising alone on 2
distinct (replica, generation) is poison and its raises are struck off; 3 unexplained raises in a row replace a
replica, a success clears them)."""
from __future__ import annotations

import pytest

from reasonrl.fleet.poison import RaiseTracker

ERR = "FaultRaised: fault point: raise"


def test_a_poison_prompt_in_a_fleet_of_two_is_dropped_and_no_replica_is_charged():
    t = RaiseTracker(max_strikes=3)
    # replica1's call of prompts 1 and 3 raises: both go again alone, off replica1; replica1 has 1 strike
    v = t.raised("replica1", [1, 3], ERR)
    assert v.retry == [1, 3] and v.poison == {} and v.replace is None
    assert t.isolated == {1, 3} and t.avoid == {1: "replica1", 3: "replica1"} and t.strike_count("replica1") == 1
    t.answered("replica0", [3])  # prompt 3 alone on replica0: fine, forgotten
    assert t.isolated == {1} and 3 not in t.avoid
    v = t.raised("replica0", [1], ERR)  # prompt 1 alone on replica0 raises: 1 replica so far, again off replica0
    assert v.retry == [1] and v.poison == {} and t.avoid[1] == "replica0" and t.strike_count("replica0") == 1
    v = t.raised("replica1", [1], ERR)  # alone on replica1 too: 2 distinct replicas -> poison
    assert v.retry == [] and v.replace is None
    assert v.poison == {1: f"poison prompt: its generate call raised alone on replica0, replica1: {ERR}"}
    # every raise prompt 1 took part in is struck off: replica1's 2-prompt call and replica0's single one
    assert t.strike_count("replica0") == 0 and t.strike_count("replica1") == 0
    assert t.isolated == set() and t.avoid == {} and t.alone == {}


def test_a_replica_raising_on_distinct_prompts_that_answer_elsewhere_is_replaced_at_the_third():
    t = RaiseTracker(max_strikes=3)
    assert t.raised("replica0", [0, 2], ERR).replace is None  # strike 1
    t.answered("replica1", [0])
    t.answered("replica1", [2])  # its prompts answer elsewhere: not poison, replica0 keeps its strike
    assert t.strike_count("replica0") == 1
    assert t.raised("replica0", [4, 6], ERR).replace is None  # strike 2
    v = t.raised("replica0", [8], ERR)  # strike 3: replaced; the prompt still goes again alone
    assert v.replace == f"failing: 3 generate calls in a row raised, the last: {ERR}" and v.retry == [8]
    t.replaced("replica0")
    assert t.strike_count("replica0") == 0 and t.generation == {"replica0": 1}


def test_a_success_clears_a_replicas_strikes():
    t = RaiseTracker(max_strikes=2)
    t.raised("replica0", [0, 1], ERR)
    t.answered("replica0", [2])
    assert t.strike_count("replica0") == 0 and t.raised("replica0", [3, 4], ERR).replace is None


def test_in_a_fleet_of_one_the_replacement_is_the_second_replica_a_poison_prompt_must_raise_on():
    t = RaiseTracker(max_strikes=3)
    assert t.raised("replica0", [0, 1], ERR).retry == [0, 1]  # strike 1
    t.answered("replica0", [0])  # the lone replica answers prompt 0 alone: strikes cleared
    v = t.raised("replica0", [1], ERR)  # strike 1: raised alone on (replica0, 0)
    assert v.poison == {} and v.retry == [1]
    v = t.raised("replica0", [1], ERR)  # the same replica again is not a second replica: strike 2
    assert v.poison == {} and v.replace is None
    v = t.raised("replica0", [1], ERR)  # strike 3: replaced (one restart)
    assert v.poison == {} and v.replace is not None
    t.replaced("replica0")
    v = t.raised("replica0", [1], ERR)  # the replacement raises too: poison
    assert v.poison == {1: f"poison prompt: its generate call raised alone on replica0, replica0 (generation 1): "
                           f"{ERR}"}
    assert t.strike_count("replica0") == 0


def test_a_raise_must_hold_a_prompt_and_the_strike_limit_is_at_least_one():
    with pytest.raises(ValueError, match="held no prompt"):
        RaiseTracker().raised("replica0", [], ERR)
    with pytest.raises(ValueError, match="max_strikes=0"):
        RaiseTracker(max_strikes=0)
