"""CriticWorker in-process (world size 1, gloo, no Ray): values on response positions, clipped value-loss updates
toward fixed returns, micro-batch invariance, checkpoint round trip."""
from __future__ import annotations

import pytest
import torch

from helpers import critic_batch, make_critic_worker, make_tiny_causal_lm


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> str:
    return make_tiny_causal_lm(tmp_path_factory.mktemp("tiny_critic_lm"), seed=7)


def test_first_update_metrics_match_hand_values(tiny_lm):
    worker = make_critic_worker(tiny_lm)
    batch = critic_batch()
    batch = batch.union(worker.compute_values(batch))
    # The head starts at zero, so V = 0 everywhere.
    assert batch["values"].shape == (4, 3) and torch.count_nonzero(batch["values"]) == 0
    m = worker.update_critic(batch)
    # Loss = 0.5 * token-mean(max((V-R)^2, (Vclip-R)^2)) with V = Vold = 0: 0.5 * (6 ones + 6 zeros)/12 = 0.25.
    assert m["critic/value_loss"] == pytest.approx(0.25)
    # V = Vold gives equal clipped/unclipped errors: nothing counts as clipped.
    assert m["critic/vf_clip_frac"] == 0.0
    # Explained variance of the old values: 1 - Var(R - 0) / Var(R) = 0.
    assert m["critic/explained_variance"] == pytest.approx(0.0)
    assert m["critic/returns_mean"] == pytest.approx(0.5)
    assert m["critic/grad_norm"] > 0
    assert m["critic/lr"] == pytest.approx(0.01)


def test_updates_toward_fixed_returns_reduce_the_value_loss(tiny_lm):
    worker = make_critic_worker(tiny_lm, "critic.cliprange_value=10.0")
    batch = critic_batch()
    losses, evs = [], []
    for _ in range(12):
        step = batch.union(worker.compute_values(batch))
        m = worker.update_critic(step)
        losses.append(m["critic/value_loss"])
        evs.append(m["critic/explained_variance"])
    assert losses[0] == pytest.approx(0.25)
    assert losses[-1] < 0.5 * losses[0], losses
    assert evs[-1] > 0.5, evs  # the critic now explains most of the return variance
    # Padding positions stay exactly 0.
    assert torch.all(worker.compute_values(batch)["values"][batch["response_mask"] == 0] == 0)


def test_value_clipping_bounds_the_step(tiny_lm):
    # With cliprange 0 the clipped values equal the old ones, so max(.,.) >= (Vold - R)^2: the loss is at least the
    # old-value loss (0.25 at the start) and, once V moves, the clipped branch is the larger on some tokens.
    worker = make_critic_worker(tiny_lm, "critic.cliprange_value=0.0")
    batch = critic_batch()
    old = batch.union(worker.compute_values(batch))
    worker.update_critic(old)
    m = worker.update_critic(old)  # second pass against the same old values: V has moved away from Vold
    assert m["critic/value_loss"] >= 0.25 - 1e-6
    assert m["critic/vf_clip_frac"] > 0


def test_micro_batch_split_does_not_change_the_update(tiny_lm):
    batch = critic_batch()
    after = []
    for micro in (4, 1):
        worker = make_critic_worker(tiny_lm, f"actor.micro_batch_size_per_worker={micro}")
        worker.update_critic(batch.union(worker.compute_values(batch)))
        after.append(worker.compute_values(batch)["values"])
    torch.testing.assert_close(after[0], after[1], atol=1e-5, rtol=1e-4)


def test_update_needs_returns(tiny_lm):
    worker = make_critic_worker(tiny_lm)
    batch = critic_batch()
    del batch.tensors["returns"]
    with pytest.raises(KeyError, match="returns"):
        worker.update_critic(batch.union(worker.compute_values(batch)))


def test_checkpoint_round_trip(tiny_lm, tmp_path):
    worker = make_critic_worker(tiny_lm)
    batch = critic_batch()
    for _ in range(2):
        worker.update_critic(batch.union(worker.compute_values(batch)))
    worker.save_checkpoint(str(tmp_path))
    files = {p.name for p in (tmp_path / "critic").iterdir()}
    assert {"config.json", "value_head.safetensors", "critic_optim.pt"} <= files
    trained = worker.compute_values(batch)["values"]

    fresh = make_critic_worker(tiny_lm)
    assert torch.count_nonzero(fresh.compute_values(batch)["values"]) == 0
    fresh.load_checkpoint(str(tmp_path))
    torch.testing.assert_close(fresh.compute_values(batch)["values"], trained)
    # Optimizer state came back too: one more identical update gives identical values.
    step = batch.union(fresh.compute_values(batch))
    worker.update_critic(step)
    fresh.update_critic(step)
    torch.testing.assert_close(fresh.compute_values(batch)["values"], worker.compute_values(batch)["values"],
                               atol=1e-6, rtol=1e-5)
    with pytest.raises(FileNotFoundError, match="critic"):
        fresh.load_checkpoint(str(tmp_path / "nowhere"))


@pytest.mark.slow
def test_real_smollm2_critic_learns(model_path):
    worker = make_critic_worker(model_path, "critic.lr=1e-4", "critic.cliprange_value=10.0")
    batch = critic_batch()
    losses = []
    for _ in range(4):
        m = worker.update_critic(batch.union(worker.compute_values(batch)))
        losses.append(m["critic/value_loss"])
    assert losses[0] == pytest.approx(0.25)
    assert losses[-1] < losses[0], losses
