"""DAPO dynamic sampling on the controller side: keep groups whose rewards differ, refill, trim to even work."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from reasonrl.data.prompt_stats import group_verdicts
from reasonrl.data.sample import Round, Sample
from reasonrl.trainer.dynamic_sampling import informative_group_ids, refill_informative_groups, usable_groups


def make_round(tag: str, group_scores):
    """One group per entry of ``group_scores`` (each a list of n scores); prompts are named tag0, tag1, ..."""
    prompts = [f"{tag}{g}" for g in range(len(group_scores))]
    scores = [s for group in group_scores for s in group]
    samples = [Sample(prompt=prompts[g], group=g, response_ids=[], response_text=f"{tag}{g}-{j}", rollout_log_probs=[],
                      finish_reason="stop", result=SimpleNamespace(score=score))
               for g, grp in enumerate(group_scores) for j, score in enumerate(grp)]
    return Round(prompts, samples)


def test_informative_groups_are_those_with_different_scores():
    # n=2: [1,1] all right, [0,1] mixed, [0,0] all wrong, [0.5,0] mixed -> groups 1 and 3.
    rnd = make_round("a", [[1, 1], [0, 1], [0, 0], [0.5, 0]])
    assert informative_group_ids(rnd) == [1, 3]


def test_groups_come_from_the_samples_group_ids_not_from_their_order_or_count():
    # Samples of 3 prompts, interleaved and uneven (group 0: scores 1, 0; group 1: none left; group 2: 1, 1, 1):
    # grouped by Sample.group, group 0 is the only informative one and group 1 is empty.
    prompts = ["p0", "p1", "p2"]
    samples = [Sample(group=g, response_ids=[], response_text=f"{g}-{j}", rollout_log_probs=[], finish_reason="stop",
                      prompt=prompts[g], result=SimpleNamespace(score=score, correct=bool(score), failed=False))
               for g, j, score in [(2, 0, 1), (0, 0, 1), (2, 1, 1), (0, 1, 0), (2, 2, 1)]]
    rnd = Round(prompts, samples, [10, 11, 12])
    assert [[s.response_text for s in g] for g in rnd.groups()] == [["0-0", "0-1"], [], ["2-0", "2-1", "2-2"]]
    assert informative_group_ids(rnd) == [0]
    assert group_verdicts(rnd) == [[True, False], [], [True, True, True]]
    # the groups kept by dynamic sampling, in the order chosen, renumbered: group 2 first, then group 0
    picked = rnd.select_groups([2, 0])
    assert picked.prompts == ["p2", "p0"]
    assert [[s.response_text for s in g] for g in picked.groups()] == [["2-0", "2-1", "2-2"], ["0-0", "0-1"]]
    assert informative_group_ids(picked) == [1]
    with pytest.raises(ValueError, match="group 3 in a round of 3 prompts"):
        Round(prompts, samples + [replace(samples[0], group=3)]).groups()


@pytest.mark.parametrize("kept,world,mini,expected", [
    (0, 1, 4, 0),
    (3, 1, 4, 3),   # one short mini-batch on the single rank
    (6, 1, 4, 4),   # one full mini-batch of 4; 2 groups dropped
    (5, 2, 4, 4),   # lcm(2, 4) = 4 -> 4
    (3, 2, 4, 2),   # below one mini-batch: a multiple of the 2 ranks
    (5, 2, 3, 2),   # mini 3 is not a multiple of 2 ranks: at most 2 groups, below the mini-batch size
    (6, 2, 3, 6),   # lcm(2, 3) = 6
    (1, 2, 4, 0),   # one group cannot be split over 2 ranks
])
def test_usable_groups(kept, world, mini, expected):
    assert usable_groups(kept, world, mini) == expected


def test_refill_takes_informative_groups_from_later_rounds_and_stops_at_target():
    first = make_round("a", [[1, 1], [0, 1], [0, 0], [0, 0]])   # 1 informative (a1)
    more = iter([make_round("b", [[0, 0], [1, 0], [1, 1], [0, 1]]),  # 2 informative (b1, b3)
                 make_round("c", [[0, 1], [1, 0], [0, 1], [1, 0]])])  # 4 informative; only 1 needed
    out, m = refill_informative_groups(first, lambda: next(more), target_groups=4, max_rounds=3,
                                       world_size=2, mini_batch_prompts=4)
    assert out.prompts == ["a1", "b1", "b3", "c0"]
    assert [s.response_text for s in out.samples] == ["a1-0", "a1-1", "b1-0", "b1-1", "b3-0", "b3-1", "c0-0", "c0-1"]
    assert [s.group for s in out.samples] == [0, 0, 1, 1, 2, 2, 3, 3]  # renumbered: the groups of the new round
    assert [r.score for r in out.results] == [0, 1, 1, 0, 0, 1, 0, 1]
    # 3 rounds x 4 prompts sampled; 4 kept; 12 - 4 = 8 dropped.
    assert m["dynamic_sampling/rounds"] == 3
    assert m["dynamic_sampling/groups_sampled"] == 12
    assert m["dynamic_sampling/groups_kept"] == 4
    assert m["dynamic_sampling/groups_dropped"] == 8
    assert m["dynamic_sampling/fallback"] == 0


def test_resampling_is_capped_and_result_trimmed_for_the_ranks():
    calls = []

    def sample():
        calls.append(1)
        return make_round(f"r{len(calls)}", [[0, 0], [1, 1], [0, 1], [1, 1]])  # 1 informative per round

    first = make_round("a", [[0, 0], [0, 0], [1, 0], [1, 1]])  # 1 informative
    out, m = refill_informative_groups(first, sample, target_groups=4, max_rounds=2, world_size=2,
                                       mini_batch_prompts=4)
    assert len(calls) == 2  # the cap: 2 extra rounds
    # 3 informative groups; 2 ranks -> 2 usable (below one mini-batch of 4)
    assert m["dynamic_sampling/groups_informative"] == 3
    assert out.prompts == ["a2", "r12"]
    assert len(out.samples) == 4 and len(out.results) == 4


def test_no_informative_group_falls_back_to_the_first_round():
    first = make_round("a", [[0, 0], [1, 1]])
    out, m = refill_informative_groups(first, lambda: make_round("b", [[0, 0], [0, 0]]), target_groups=2,
                                       max_rounds=1, world_size=1, mini_batch_prompts=2)
    assert out is first
    assert m["dynamic_sampling/fallback"] == 1 and m["dynamic_sampling/groups_kept"] == 2
