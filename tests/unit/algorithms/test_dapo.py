"""DAPO dynamic-sampling filter, overlong penalty, and truncated importance sampling, by hand."""

import math

import pytest
import torch

from reasonrl.algorithms import filter_groups, logprob_mismatch_stats, overlong_penalty, tis_weights


def close(actual, expected, atol=1e-5):
    actual = torch.as_tensor(actual)
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# ----------------------------------------------------------------------------- dynamic sampling


def test_filter_groups_keeps_only_groups_with_spread():
    # group 0: [1, 1] all right -> drop; group 1: [0, 1] -> keep; group 2: [0, 0] all wrong -> drop;
    # group 3: a single response -> no spread -> drop.
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3])
    assert filter_groups(scores, groups).tolist() == [False, False, True, True, False, False, False]


def test_filter_groups_interleaved_ids_and_partial_scores():
    # group 9 = responses 0, 2 with [0.5, 0.5] -> drop; group 4 = responses 1, 3 with [0.5, 0.25] -> keep.
    keep = filter_groups(torch.tensor([0.5, 0.5, 0.5, 0.25]), torch.tensor([9, 4, 9, 4]))
    assert keep.dtype == torch.bool
    assert keep.tolist() == [False, True, False, True]


def test_filter_groups_bad_input():
    with pytest.raises(ValueError, match="must both be"):
        filter_groups(torch.zeros(3), torch.zeros(2).long())


# ----------------------------------------------------------------------------- overlong shaping


def test_overlong_penalty_linear_ramp():
    # max_new_tokens 100, buffer 20, penalty 1: the ramp starts at 80 tokens.
    #   0, 80 -> 0;  90 -> -(10/20) = -0.5;  95 -> -0.75;  100 -> -1;  120 (beyond) -> -1.
    lengths = torch.tensor([0, 80, 90, 95, 100, 120])
    close(overlong_penalty(lengths, 100, 20, 1.0), [0.0, 0.0, -0.5, -0.75, -1.0, -1.0])
    # penalty 0.5 halves it: 90 -> -0.25.
    close(overlong_penalty(torch.tensor([90]), 100, 20, 0.5), [-0.25])


def test_overlong_penalty_off_and_bad_buffer():
    close(overlong_penalty(torch.tensor([100, 5]), 100, 0, 1.0), [0.0, 0.0])
    with pytest.raises(ValueError, match="must not exceed"):
        overlong_penalty(torch.tensor([1]), 10, 20, 1.0)


# ----------------------------------------------------------------------------- truncated IS

# Row 0: old - rollout = [ln 1.5, ln 3, ln 0.5] + a padding token with a huge difference.
# Row 1: [ln 0.5, ln 0.5] + 2 padding tokens.
DIFF = torch.tensor(
    [[math.log(1.5), math.log(3), math.log(0.5), 50.0], [math.log(0.5), math.log(0.5), 50.0, 50.0]]
)
ROLLOUT = torch.full((2, 4), -2.0)
OLD = ROLLOUT + DIFF
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])


def test_tis_token_mode():
    # cap 2: min([1.5, 3, 0.5], 2) = [1.5, 2, 0.5]; row 1: [0.5, 0.5]; 0 on padding.
    weights = tis_weights(OLD, ROLLOUT, MASK, "token", cap=2.0)
    close(weights, [[1.5, 2.0, 0.5, 0.0], [0.5, 0.5, 0.0, 0.0]])


def test_tis_sequence_mode():
    # Row 0 product 1.5 * 3 * 0.5 = 2.25 -> min(2.25, 2) = 2 (cap 2) or 2.25 (cap 3) on each valid token.
    # Row 1 product 0.25 (below the cap, untouched).
    close(tis_weights(OLD, ROLLOUT, MASK, "sequence", cap=2.0), [[2.0, 2.0, 2.0, 0.0], [0.25, 0.25, 0.0, 0.0]])
    close(tis_weights(OLD, ROLLOUT, MASK, "sequence", cap=3.0), [[2.25, 2.25, 2.25, 0.0], [0.25, 0.25, 0.0, 0.0]])


def test_tis_weights_carry_no_gradient_and_never_overflow():
    old = (ROLLOUT + 1000.0).requires_grad_(True)
    weights = tis_weights(old, ROLLOUT, MASK, "sequence", cap=2.0)
    assert not weights.requires_grad
    close(weights, MASK * 2.0)


def test_tis_bad_input():
    with pytest.raises(ValueError, match="unknown importance-sampling level"):
        tis_weights(OLD, ROLLOUT, MASK, "tok", cap=2.0)
    with pytest.raises(ValueError, match="cap must be positive"):
        tis_weights(OLD, ROLLOUT, MASK, "token", cap=0.0)


def test_logprob_mismatch_stats():
    # |diff| over valid tokens: ln 1.5 = 0.405465, ln 3 = 1.098612, ln 2 = 0.693147 (x3).
    # mean = (0.405465 + 1.098612 + 3 * 0.693147) / 5 = 3.583518 / 5 = 0.716704; max = 1.098612.
    stats = logprob_mismatch_stats(OLD, ROLLOUT, MASK)
    assert set(stats) == {"rollout/logprob_diff_mean", "rollout/logprob_diff_max"}
    assert stats["rollout/logprob_diff_mean"] == pytest.approx(0.716704, abs=1e-5)
    assert stats["rollout/logprob_diff_max"] == pytest.approx(math.log(3), abs=1e-5)
    assert logprob_mismatch_stats(OLD, ROLLOUT, torch.zeros(2, 4)) == {
        "rollout/logprob_diff_mean": 0.0,
        "rollout/logprob_diff_max": 0.0,
    }
