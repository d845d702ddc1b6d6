"""Token-budget micro-batches (``reasonrl.data.micro_batches``): the grouping by hand, and the actor worker's update
giving the one-big-batch gradient with token-budget micro-batches, packed or padded, for every loss_agg_mode."""
from __future__ import annotations

import pytest
import torch

from reasonrl.data.micro_batches import (fixed_size_groups, loss_denominator, micro_batch_groups, restore_order,
                                         token_budget_groups)
from reasonrl.workers.actor_update import policy_update

from helpers import cpu_worker_plan, critic_batch, free_port, make_critic_worker, make_tiny_causal_lm, make_tiny_policy

# (prompt, response) lengths; totals 8, 4, 3, 9, 4.
PROMPTS = [2, 3, 1, 4, 2]
RESPONSES = [6, 1, 2, 5, 2]


def test_packed_first_fit_decreasing_by_hand():
    # Order by total, ties by index: row3 (9), row0 (8), row1 (4), row4 (4), row2 (3). Budget 12:
    # row3 -> G0 (9); row0: 17 > 12 -> G1 (8); row1: G0 13 > 12, G1 12 -> G1; row4: 13, 16 -> G2 (4);
    # row2: G0 9 + 3 = 12 -> G0.
    assert token_budget_groups(PROMPTS, RESPONSES, 12) == [[2, 3], [0, 1], [4]]


def test_padded_cost_is_rows_times_longest_prompt_plus_longest_response():
    # Budget 16, cost = rows x (max prompt + max response): row3 -> G0 1x9; row0: G0 2x(4+6)=20 -> G1 1x8;
    # row1: G0 2x9=18, G1 2x(3+6)=18 -> G2 1x4; row4: G0 18, G1 2x(2+6)=16 -> G1; row2: G0 18, G1 3x8=24,
    # G2 2x(3+2)=10 -> G2.
    assert token_budget_groups(PROMPTS, RESPONSES, 16, packed=False) == [[3], [0, 4], [1, 2]]


def test_rows_over_the_budget_run_alone_and_min_groups_splits_the_largest_group():
    assert token_budget_groups(PROMPTS, RESPONSES, 5) == [[3], [0], [1], [4], [2]]
    # Budget 12 gives G0 = [row3, row2], G1 = [row0, row1], G2 = [row4]; 4 groups: G0 (first of the two-row
    # groups) splits into [3] and [2].
    assert token_budget_groups(PROMPTS, RESPONSES, 12, min_groups=4) == [[3], [2], [0, 1], [4]]
    with pytest.raises(ValueError, match="6 micro-batches of 5 rows"):
        token_budget_groups(PROMPTS, RESPONSES, 12, min_groups=6)
    with pytest.raises(ValueError, match="positive"):
        token_budget_groups(PROMPTS, RESPONSES, 0)


def test_micro_batch_groups_reads_lengths_from_the_mask_and_agrees_on_the_count():
    # P = 4 prompt columns (left-padded), T = 6 response columns (right-padded), the lengths above.
    mask = torch.zeros(5, 10, dtype=torch.long)
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
        mask[i, 4 - p:4 + r] = 1
    assert micro_batch_groups(mask, 6, rows_per_group=2, max_tokens=0, packed=True) == [[0, 1], [2, 3], [4]]
    assert micro_batch_groups(mask, 6, 2, 12, packed=True) == [[2, 3], [0, 1], [4]]
    # Another rank needs 4 forwards: this one splits to match.
    assert micro_batch_groups(mask, 6, 2, 12, packed=True, agree=lambda n: 4) == [[3], [2], [0, 1], [4]]
    assert fixed_size_groups(3, 0) == [[0], [1], [2]]


def test_restore_order_puts_rows_back():
    groups = [[2, 3], [0, 1], [4]]
    parts = [torch.tensor([[20.0], [30.0]]), torch.tensor([[0.0], [10.0]]), torch.tensor([[40.0]])]
    assert restore_order(parts, groups).squeeze(-1).tolist() == [0.0, 10.0, 20.0, 30.0, 40.0]


def test_loss_denominator_by_hand():
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    assert loss_denominator(mask, "token-mean") == 3.0            # valid tokens
    assert loss_denominator(mask, "seq-mean-token-mean") == 2.0   # rows with a token (row 1 is empty)
    assert loss_denominator(mask, "seq-mean-token-sum-norm") == 3.0  # all rows
    assert loss_denominator(mask, "seq-mean-token-sum") == 2.0    # rows with a token, like seq-mean-token-mean
    with pytest.raises(ValueError, match="unknown"):
        loss_denominator(mask, "sum")


# ----------------------------------------------------------------------------- the worker's update, for real


def update_gradient(policy: str, mode: str, *overrides: str):
    """One update of a fresh actor worker (tiny random Llama, world size 1, fp32, no clipping, no old-log-prob pass):
    the gradient the optimizer stepped with, by parameter name, and the update's metrics."""
    from reasonrl.config import load_config, to_dict
    from reasonrl.data.collate import collate_rollout
    from reasonrl.workers.actor_rollout_ref import ActorRolloutRefWorker

    g = torch.Generator().manual_seed(3)
    prompts = [[1 + i, 2, 3 + i][: 1 + i % 3] for i in range(8)]
    responses = [[int(t) for t in torch.randint(5, 60, (n,), generator=g)] for n in (7, 2, 0, 11, 5, 1, 9, 3)]
    batch = collate_rollout(prompts, responses, [[-1.0] * len(r) for r in responses], pad_id=0)
    batch["advantages"] = torch.randn(8, 1, generator=g) * batch["response_mask"]
    cfg, _ = load_config(["rollout.engine=hf", "trainer.device=cpu", "data.train_batch_size=4", "rollout.n=2",
                          "actor.micro_batch_size_per_worker=8", "actor.grad_clip=0", "algorithm.use_kl_loss=false",
                          "algorithm.entropy_coef=0.01", f"algorithm.loss_agg_mode={mode}", *overrides],
                         cuda_available=False)
    worker = ActorRolloutRefWorker(to_dict(cfg), policy, rank=0, world_size=1, master_addr="127.0.0.1",
                                   master_port=free_port(), num_threads=1, plan=cpu_worker_plan(cfg))
    # the update without the offload moves, the last mini-batch's gradients left on the parameters
    metrics = policy_update(worker.policy, batch, worker.cfg.algorithm.kl_coef)
    grads = {n: p.grad.full_tensor().clone() for n, p in worker.policy.model.named_parameters() if p.grad is not None}
    return grads, metrics


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory, model_path):
    return make_tiny_policy(tmp_path_factory.mktemp("tiny_policy"), model_path)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_token_budget_micro_batches_give_the_one_big_batch_gradient(tiny_policy, mode):
    # Rows are 0-14 tokens long; a 16-token budget makes 4+ micro-batches of different row counts, one of them
    # holding the empty response (row 2): with seq-mean-token-mean it must not count.
    big, big_metrics = update_gradient(tiny_policy, mode)
    for overrides in (("actor.max_tokens_per_micro_batch=16", "actor.use_packing=true"),
                      ("actor.max_tokens_per_micro_batch=24",),
                      ("actor.micro_batch_size_per_worker=3", "actor.use_packing=true")):
        split, metrics = update_gradient(tiny_policy, mode, *overrides)
        assert split.keys() == big.keys() and len(big) > 5
        # The update stands in for the skipped old-log-prob pass: its entropy metric is a token mean too.
        assert metrics["actor/entropy"] == pytest.approx(big_metrics["actor/entropy"], rel=1e-5)
        for name, g in big.items():
            # Summed over micro-batches in fp32, each element is off by rounding that scales with the tensor's
            # largest gradient, not its own (3.7e-6 at a largest 0.47 on the tied embedding, transformers 5.19); a
            # row weighted wrongly or leaking across a packed boundary is off by ~1e-2 of it.
            err, scale = float((split[name] - g).abs().max()), float(g.abs().max())
            assert err <= 1e-6 + 2e-5 * scale, f"{overrides} {name}: off by {err:.3g} at a largest {scale:.3g}"
    assert any(g.abs().max() > 1e-4 for g in big.values())  # a real gradient, not zeros on both sides


@pytest.mark.slow
def test_two_ranks_with_different_group_counts_match_one_rank(tiny_policy):
    """Token budget over 2 gloo ranks (Ray): the ranks' rows need different numbers of groups, so the one with fewer
    splits to match (each forward is an FSDP collective: a mismatch would hang). The update equals 1 rank's."""
    import ray

    from reasonrl.config import load_config, to_dict
    from reasonrl.controller import WorkerGroup, start_ray
    from reasonrl.data.collate import collate_rollout
    from reasonrl.workers.actor_rollout_ref import ActorRolloutRefWorker

    # Rank 0 gets rows 0-3 (short: one 40-token group), rank 1 rows 4-7 (long: 4 groups of one row).
    prompts = [[1, 2, 3]] * 8
    responses = [[5 + i] * 4 for i in range(4)] + [[9 + i] * 30 for i in range(4)]
    batch = collate_rollout(prompts, responses, [[-1.0] * len(r) for r in responses], pad_id=0)
    batch["advantages"] = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.2, -0.2, 1.0, -1.0])[:, None] * batch["response_mask"]
    start_ray(None, num_cpus=2)
    after = {}
    try:
        for world, budget in ((1, 0), (2, 40)):
            cfg, _ = load_config(["rollout.engine=hf", "trainer.device=cpu", "data.train_batch_size=4", "rollout.n=2",
                                  "actor.lr=1e-3", "algorithm.use_kl_loss=false", "actor.use_packing=true",
                                  f"actor.max_tokens_per_micro_batch={budget}"], cuda_available=False)
            group = WorkerGroup(ActorRolloutRefWorker, world, False, 1, {"config": to_dict(cfg),
                                                                         "model_path": tiny_policy,
                                                                         "plan": cpu_worker_plan(cfg, world)})
            metrics = group.update_actor(batch)
            after[world] = (group.compute_log_probs(batch)["old_log_probs"], metrics["actor/grad_norm"])
            group.shutdown()
    finally:
        ray.shutdown()
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(after[2][0][mask], after[1][0][mask], atol=1e-5, rtol=1e-5)
    assert after[2][1] == pytest.approx(after[1][1], rel=1e-4)


def test_critic_update_with_packing_and_a_token_budget_equals_the_default(tmp_path):
    """The critic's values and update through packed token-budget micro-batches (rows of 5-7 tokens, budget 12:
    groups of one or two rows) equal the default fixed-row padded ones."""
    path = make_tiny_causal_lm(tmp_path / "lm", seed=7)
    batch = critic_batch()
    results = []
    for flags in ((), ("actor.use_packing=true", "critic.max_tokens_per_micro_batch=12")):
        worker = make_critic_worker(path, *flags)
        metrics = worker.update_critic(batch.union(worker.compute_values(batch)))
        results.append((worker.compute_values(batch)["values"], metrics["critic/grad_norm"]))
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(results[1][0][mask], results[0][0][mask], atol=1e-6, rtol=1e-5)
    assert results[1][1] == pytest.approx(results[0][1], rel=1e-5)
    assert results[0][0][mask].abs().max() > 0  # the update moved the values off the zero head
