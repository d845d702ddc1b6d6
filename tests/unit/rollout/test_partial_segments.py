"""The bookkeeping of partial rollouts (reasonrl/rollout/partial.py), with hand-derived numbers: each segment's
budget, which sequences continue, where a sequence ends, and the version of every token across a version bump."""
import pytest

from reasonrl.rollout.base import Completion
from reasonrl.rollout.partial import Sequence, VersionedCompletion, absorb, segment_budget
from reasonrl.workers.engine_host import completions_to_samples


def _piece(ids, reason="length"):
    return Completion(list(ids), "", [-0.5 * t for t in ids], reason)


def test_segment_budgets_take_the_rest_of_the_budget():
    # max_new_tokens 10 in segments of 4: 4, 4, then the 2 left; nothing once 10 are out
    assert [segment_budget(g, 10, 4) for g in (0, 4, 8, 10)] == [4, 4, 2, 0]
    assert segment_budget(0, 3, 4) == 3  # a budget below one segment: one short segment
    assert segment_budget(12, 10, 4) == 0


def test_versions_across_a_bump_and_the_budget_ends_the_sequence():
    # budget 10, segments of 4: [4 tokens @ v0] [4 @ v1] [2 @ v1] -> "length" after exactly 10
    s = Sequence([100, 101])
    absorb(s, _piece([1, 2, 3, 4]), version=0, asked=4, max_new_tokens=10)
    assert not s.done and s.versions == [0, 0, 0, 0]
    absorb(s, _piece([5, 6, 7, 8]), version=1, asked=4, max_new_tokens=10)
    assert not s.done and s.versions == [0] * 4 + [1] * 4
    absorb(s, _piece([9, 10]), version=1, asked=2, max_new_tokens=10)
    assert s.finish_reason == "length"
    assert s.token_ids == list(range(1, 11))
    assert s.versions == [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert s.logprobs == [-0.5 * t for t in range(1, 11)]
    with pytest.raises(ValueError, match="finished"):
        absorb(s, _piece([11]), version=1, asked=1, max_new_tokens=10)


def test_stop_ends_and_a_short_segment_ends():
    eos = Sequence([7])
    absorb(eos, _piece([1, 2, 3, 4]), 0, 4, 10)
    absorb(eos, _piece([5, 2], "stop"), 3, 4, 10)  # EOS (id 2) after 6 tokens: stop, kept
    assert eos.finish_reason == "stop" and eos.token_ids == [1, 2, 3, 4, 5, 2] and eos.versions == [0] * 4 + [3] * 2
    full = Sequence([7])
    absorb(full, _piece([1, 2]), 0, 4, 10)  # "length" with 2 of 4 asked: the engine's context is full
    assert full.finish_reason == "length" and full.token_ids == [1, 2]
    at_context = Sequence([7, 8])  # a context of 6 (prompt + response): full after a full segment of 4
    absorb(at_context, _piece([1, 2, 3, 4]), 0, 4, 10, max_len=6)
    assert at_context.finish_reason == "length"
    below = Sequence([7])
    absorb(below, _piece([1, 2, 3, 4]), 0, 4, 10, max_len=6)  # 5 of 6: it continues
    assert not below.done
    with pytest.raises(ValueError, match="5 tokens for a segment of 4"):
        absorb(Sequence([7]), _piece([1, 2, 3, 4, 5]), 0, 4, 10)


def test_a_stop_string_across_two_segments_cuts_the_whole_response():
    # the "stop string" is the pair of tokens 3, 4; the first segment ends on 3, the next starts with 4
    def stop_end(ids):
        return next((j + 2 for j in range(len(ids) - 1) if ids[j:j + 2] == [3, 4]), None)

    s = Sequence([9])
    absorb(s, _piece([1, 2, 3]), 0, 3, 12, stop_end)
    assert not s.done
    absorb(s, _piece([4, 5, 6]), 1, 3, 12, stop_end)  # 5 and 6 were generated past the stop: dropped
    assert s.finish_reason == "stop"
    assert s.token_ids == [1, 2, 3, 4] and s.versions == [0, 0, 0, 1] and s.logprobs == [-0.5, -1.0, -1.5, -2.0]


def test_samples_carry_the_versions():
    c = VersionedCompletion([1, 2, 3], "abc", [], "stop", [4, 4, 5])
    assert (c.oldest_version, c.newest_version) == (4, 5)
    plain = Completion([1], "a", [], "length")
    partial, one = completions_to_samples([3], [[c, plain]])
    assert partial.token_versions == [4, 4, 5] and (partial.oldest_version, partial.newest_version) == (4, 5)
    assert partial.weights_version == 4  # the oldest: the lag of its stalest token
    assert one.token_versions is None and one.oldest_version is None and one.weights_version is None
    assert not partial.joined_running and not one.joined_running
    joined = VersionedCompletion([1], "a", [], "stop", [6], joined=True)  # its call joined running engine steps
    [s] = completions_to_samples([0], [[joined]])
    assert s.joined_running
