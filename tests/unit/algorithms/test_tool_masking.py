"""Tool-turn tokens are masked out of training: hand-built trajectories through collate, the loss, KL, entropy,
advantages, and the tool metrics (every expected number derived by hand in a comment)."""
from __future__ import annotations

import pytest
import torch

from reasonrl.algorithms import aggregate_loss, compute_advantages, kl_penalty, policy_loss, scores_to_token_rewards
from reasonrl.data import Batch
from reasonrl.data.collate import collate_rollout, loss_mask
from reasonrl.trainer.metrics import tool_metrics

# Two trajectories. Row 0: model 2 tokens, tool 3 tokens, model 1 token. Row 1: model 2 tokens, no call.
PROMPTS = [[5, 6], [7]]
RESPONSES = [[10, 11, 90, 91, 92, 12], [20, 21]]
TOOL_MASKS = [[0, 0, 1, 1, 1, 0], [0, 0]]
LOGPROBS = [[-0.1, -0.2, 0.0, 0.0, 0.0, -0.3], [-0.4, -0.5]]


def batch() -> Batch:
    return collate_rollout(PROMPTS, RESPONSES, LOGPROBS, pad_id=0, tool_masks=TOOL_MASKS)


def test_collate_builds_loss_mask_without_tool_tokens():
    b = batch()
    assert b["response_mask"].tolist() == [[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]]
    assert b["loss_mask"].tolist() == [[1, 1, 0, 0, 0, 1], [1, 1, 0, 0, 0, 0]]
    assert b["responses"][0].tolist() == RESPONSES[0]  # the tool tokens stay in the sequence the model reads
    assert loss_mask(b) is b["loss_mask"]
    plain = collate_rollout(PROMPTS, RESPONSES, LOGPROBS, pad_id=0)
    assert "loss_mask" not in plain and torch.equal(loss_mask(plain), plain["response_mask"])
    with pytest.raises(ValueError, match="row 1: tool mask has 1 entries for 2"):
        collate_rollout(PROMPTS, RESPONSES, LOGPROBS, pad_id=0, tool_masks=[TOOL_MASKS[0], [0]])


def test_policy_loss_kl_and_entropy_ignore_tool_tokens():
    mask = batch()["loss_mask"]
    # log-probs: model tokens 0 (ratio 1 against old 0); tool tokens get wild values that must not matter
    lp = torch.tensor([[0.0, 0.0, 50.0, -50.0, 9.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]], requires_grad=True)
    old = torch.zeros(2, 6)
    adv = torch.tensor([[1.0] * 6, [-1.0] * 6])
    loss, _ = policy_loss("ppo_clip", log_probs=lp, old_log_probs=old, advantages=adv, mask=mask, clip_low=0.2,
                          clip_high=0.2, clip_dual=3.0, agg_mode="token-mean", norm_length=6)
    # ratio 1 at the 5 model tokens: per-token loss -A; token-mean = -(3 * 1 + 2 * (-1)) / 5 = -0.2
    assert loss.item() == pytest.approx(-0.2)
    loss.backward()
    assert lp.grad[0, 2:5].abs().sum() == 0  # no gradient through the tool's tokens
    # d loss / d lp at a model token = -A * ratio / 5 = -0.2 (row 0) and +0.2 (row 1)
    assert lp.grad[0, 0].item() == pytest.approx(-0.2) and lp.grad[1, 1].item() == pytest.approx(0.2)

    ref = torch.tensor([[0.0, 0.0, -99.0, 99.0, 7.0, 0.0], [0.0] * 6])
    kl = aggregate_loss(kl_penalty(lp.detach(), ref, "k3"), mask, "token-mean", 6)
    assert kl.item() == pytest.approx(0.0)  # the policy equals the reference at every model token
    entropy = torch.tensor([[1.0, 1.0, 100.0, 100.0, 100.0, 1.0], [3.0, 3.0, 0.0, 0.0, 0.0, 0.0]])
    # token-mean over the 5 model tokens: (1 + 1 + 1 + 3 + 3) / 5 = 1.8
    assert aggregate_loss(entropy, mask, "token-mean", 6).item() == pytest.approx(1.8)
    # seq-mean-token-mean: row means (1 + 1 + 1) / 3 = 1 and (3 + 3) / 2 = 3, mean 2
    assert aggregate_loss(entropy, mask, "seq-mean-token-mean", 6).item() == pytest.approx(2.0)


def test_reward_lands_on_the_last_policy_token_even_after_a_tool_turn():
    # a trajectory cut while the tool wrote: model, model, tool, tool
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    assert scores_to_token_rewards(torch.tensor([2.0]), mask).tolist() == [[0.0, 2.0, 0.0, 0.0]]


def test_gae_skips_tool_tokens():
    mask = batch()["loss_mask"][:1]  # [1, 1, 0, 0, 0, 1]
    values = torch.tensor([[0.5, 0.25, 7.0, 7.0, 7.0, 0.75]])  # values at tool tokens must not be used
    adv, returns = compute_advantages("gae", scores=torch.tensor([1.0]), mask=mask, group_index=torch.tensor([0]),
                                      values=values, gamma=1.0, lam=1.0)
    # reward 1 at token 5 (the last model token); with gamma = lam = 1 the return at every model token is 1,
    # so the raw advantages are 1 - V: 0.5, 0.75, 0.25 at tokens 0, 1, 5 and 0 at the tool tokens
    assert returns.tolist() == [[1.0, 1.0, 0.0, 0.0, 0.0, 1.0]]
    raw = torch.tensor([0.5, 0.75, 0.25])
    whitened = (raw - raw.mean()) / raw.var().sqrt()  # masked_whiten: unbiased variance over the model tokens
    assert adv[0, [0, 1, 5]].tolist() == pytest.approx(whitened.tolist(), abs=1e-5)
    assert adv[0, 2:5].tolist() == [0.0, 0.0, 0.0]


def test_grpo_and_rloo_advantages_are_zero_at_tool_tokens():
    mask = batch()["loss_mask"]
    for name in ("grpo", "rloo"):
        adv, _ = compute_advantages(name, scores=torch.tensor([1.0, 0.0]), mask=mask, group_index=torch.tensor([0, 0]))
        assert adv[0, 2:5].abs().sum() == 0 and adv[0, 0] > 0 and adv[1, 0] < 0, name


def test_tool_metrics_from_hand_built_meta():
    gen = Batch(meta={"tool_mask": TOOL_MASKS, "turns": [2, 1], "tool_calls": [1, 0], "tool_errors": [1, 0],
                      "tool_timeouts": [1, 0], "tool_seconds": [2.5, 0.0]})
    m = tool_metrics(gen)
    assert m["tool/turns_mean"] == 1.5 and m["tool/turns_max"] == 2.0  # (2 + 1) / 2
    assert m["tool/calls_per_trajectory"] == 0.5 and m["tool/calls"] == 1.0
    assert m["tool/errors"] == 1.0 and m["tool/timeouts"] == 1.0 and m["tool/error_rate"] == 1.0
    assert m["tool/seconds"] == 2.5
    assert m["tool/output_token_fraction"] == pytest.approx(3 / 8)  # 3 tool tokens of 6 + 2
