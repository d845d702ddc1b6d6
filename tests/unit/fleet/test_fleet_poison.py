"""``fleet.poison``: a poison prompt told apart from a broken replica (pure; expectations derived by hand from the
rules in the module docstring: a raised call's prompts go again alone, off the replica; a prompt raising alone on 2
distinct (replica, generation) is poison and its raises are struck off; 3 unexplained raises in a row replace a
replica, a success clears them; a lost replica's running call counts for each of its prompts, alone or not, and a
prompt failing alone with 2 distinct replicas on its record, raised or lost, is poison)."""
from __future__ import annotations

import pytest

from reasonrl.fleet.poison import FailureTracker

ERR = "FaultRaised: fault point: raise"


def test_a_poison_prompt_in_a_fleet_of_two_is_dropped_and_no_replica_is_charged():
    t = FailureTracker(max_strikes=3)
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
    assert t.isolated == set() and t.avoid == {} and t.failed == {}


def test_a_replica_raising_on_distinct_prompts_that_answer_elsewhere_is_replaced_at_the_third():
    t = FailureTracker(max_strikes=3)
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
    t = FailureTracker(max_strikes=2)
    t.raised("replica0", [0, 1], ERR)
    t.answered("replica0", [2])
    assert t.strike_count("replica0") == 0 and t.raised("replica0", [3, 4], ERR).replace is None


def test_in_a_fleet_of_one_the_replacement_is_the_second_replica_a_poison_prompt_must_raise_on():
    t = FailureTracker(max_strikes=3)
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
        FailureTracker().raised("replica0", [], ERR)
    with pytest.raises(ValueError, match="max_strikes=0"):
        FailureTracker(max_strikes=0)


DIED = "died: ActorDiedError: the actor died"


def test_a_prompt_that_kills_every_replica_is_poison_at_the_second_loss_alone():
    t = FailureTracker(max_strikes=3)
    # replica1 dies running its call of prompts 1 and 3: both isolated, no strike (it is replaced anyway), no avoid
    v = t.lost("replica1", [1, 3], DIED)
    assert v.poison == {} and v.retry == [1, 3] and v.replace is None
    assert t.isolated == {1, 3} and t.avoid == {} and t.strike_count("replica1") == 0
    t.replaced("replica1")
    # replica0 dies running prompt 1 alone: 2 distinct replicas on its record, the last alone -> poison
    v = t.lost("replica0", [1], DIED)
    assert v.retry == [] and v.poison == {1: f"poison prompt: replicas replica1, replica0 were lost while it was in "
                                             f"their calls, the last time alone: {DIED}"}
    assert t.isolated == {3} and 1 not in t.failed
    t.answered("replica1", [3])  # prompt 3 answers alone on the replacement: forgotten
    assert t.isolated == set() and t.failed == {}


def test_in_a_fleet_of_one_a_killer_prompt_is_poison_on_the_replacement():
    t = FailureTracker()
    assert t.lost("replica0", [0, 1], DIED).retry == [0, 1]
    t.replaced("replica0")  # restart 1
    t.answered("replica0", [0])
    v = t.lost("replica0", [1], "hung past 3 s")  # the replacement (generation 1) hangs on prompt 1 alone
    assert v.poison == {1: "poison prompt: replicas replica0, replica0 (generation 1) were lost while it was in "
                           "their calls, the last time alone: hung past 3 s"}


def test_a_loss_is_poison_only_alone_and_an_answer_clears_the_record():
    t = FailureTracker()
    t.lost("replica0", [1, 2], DIED)
    v = t.lost("replica1", [1, 2], DIED)  # 2 distinct replicas, but not alone: which of the two killed it?
    assert v.poison == {} and v.retry == [1, 2]
    t.answered("replica2", [1])  # prompt 1 answers alone: it was not the killer
    v = t.lost("replica0", [1], DIED)  # replica0 again, generation 0 still (not replaced in this test): 1 replica
    assert v.poison == {} and v.retry == [1] and t.failed[1] == [("replica0", 0, "lost", True)]


def test_raises_and_losses_share_one_record():
    t = FailureTracker(max_strikes=3)
    assert t.raised("replica0", [4], ERR).retry == [4]  # raised alone on replica0: strike 1
    v = t.lost("replica1", [4], "hung past 3 s")  # then replica1 hangs on it alone
    assert v.poison == {4: "poison prompt: its generate calls failed on replica0 (raised alone), replica1 (lost "
                           "alone), the last: hung past 3 s"}
    assert t.strike_count("replica0") == 0  # the raise it explains is struck off
    t.lost("replica1", [5, 6], DIED)  # replica1 dies with prompts 5 and 6 in its call
    t.replaced("replica1")
    v = t.raised("replica0", [6], ERR)  # prompt 6 then raises alone on replica0: 2 replicas, the last alone
    assert v.poison == {6: f"poison prompt: its generate calls failed on replica1 (lost), replica0 (raised alone), "
                           f"the last: {ERR}"}
    assert v.retry == [] and t.strike_count("replica0") == 0 and t.isolated == {5}
