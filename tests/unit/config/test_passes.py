"""Which passes a step runs (``reasonrl.config.passes``), and the update standing in for a skipped old-log-prob
pass: the metrics it reports equal the pass's own."""
from __future__ import annotations

import pytest
import torch

from reasonrl.config import load_config
from reasonrl.config.passes import Passes, pass_rows, updates_per_batch
from reasonrl.config.plan import RunPlan

from helpers import cpu_worker_plan, free_port, make_tiny_policy


def cfg_of(*args: str):
    return load_config(["trainer.device=cpu", "data.train_batch_size=8", *args], cuda_available=False)[0]


def plan_parts(cfg):
    plan = RunPlan.build(cfg)
    return plan.passes, plan.batch


def test_one_optimizer_step_per_batch_skips_the_old_log_prob_pass():
    # GRPO defaults: 1 epoch, mini-batch = whole batch (ppo_mini_batch_size 0), KL in the loss.
    cfg = cfg_of()
    assert updates_per_batch(RunPlan.build(cfg).batch) == 1
    assert RunPlan.build(cfg).passes == Passes(old_log_probs=False, ref_log_probs=True, values=False)


@pytest.mark.parametrize("args, steps", [(("actor.ppo_epochs=2",), 2),
                                         (("actor.ppo_mini_batch_size=4",), 2),       # 8 / 4 mini-batches
                                         (("actor.ppo_mini_batch_size=2", "actor.ppo_epochs=3"), 12)])
def test_several_optimizer_steps_need_the_old_log_probs(args, steps):
    cfg = cfg_of(*args)
    assert updates_per_batch(RunPlan.build(cfg).batch) == steps
    assert RunPlan.build(cfg).passes.old_log_probs


def test_kl_in_reward_needs_old_log_probs_before_the_update_and_gae_needs_values():
    cfg = cfg_of("algorithm=ppo")  # PPO preset: GAE, KL in the reward
    assert cfg.algorithm.kl_in_reward and cfg.algorithm.adv_estimator == "gae"
    assert RunPlan.build(cfg).passes == Passes(old_log_probs=True, ref_log_probs=True, values=True)


def test_no_kl_term_skips_the_reference_pass():
    cfg = cfg_of("algorithm.use_kl_loss=false")
    assert RunPlan.build(cfg).passes == Passes(old_log_probs=False, ref_log_probs=False, values=False)


def test_start_up_rows_say_which_passes_run_and_why():
    rows = dict(pass_rows(plan_parts(cfg_of("actor.ppo_epochs=2", "algorithm.use_kl_loss=false"))[0]))
    assert rows == {"pass: old log-probs": "on (2 optimizer steps per batch)",
                    "pass: ref log-probs": "off (no KL term)",
                    "pass: values (critic)": "off"}
    assert dict(pass_rows(plan_parts(cfg_of())[0]))["pass: old log-probs"].startswith("off")


def test_update_reports_the_skipped_pass_metrics(tmp_path, model_path):
    """Without old log-probs in the batch the update's first forward gives actor/entropy, actor/kl and the rollout
    mismatch: equal to what the trainer computes from the pass (same policy, same rows)."""
    from reasonrl.algorithms import logprob_mismatch_stats
    from reasonrl.config import to_dict
    from reasonrl.data.collate import collate_rollout
    from reasonrl.trainer.metrics import policy_metrics
    from reasonrl.workers.actor_rollout_ref import ActorRolloutRefWorker

    policy = make_tiny_policy(tmp_path / "tiny", model_path)
    batch = collate_rollout([[1, 2, 3], [1, 2, 3], [4, 5], [4, 5]], [[6, 7, 8], [9], [10, 11], [12, 13, 14, 15]],
                            [[-2.0, -3.0, -4.0], [-1.0], [-5.0, -6.0], [-7.0, -8.0, -9.0, -1.0]], pad_id=0)
    batch["advantages"] = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * batch["response_mask"]
    cfg = cfg_of("rollout.engine=hf", "data.train_batch_size=2", "rollout.n=2", "actor.micro_batch_size_per_worker=3")
    worker = ActorRolloutRefWorker(to_dict(cfg), policy, rank=0, world_size=1, master_addr="127.0.0.1",
                                   master_port=free_port(), num_threads=1,
        plan=cpu_worker_plan(cfg))
    before = batch.union(worker.compute_log_probs(batch)).union(worker.compute_ref_log_probs(batch))
    mask = batch["response_mask"]
    expected = {**policy_metrics(before["old_log_probs"], before["ref_log_probs"], before["entropy"], mask),
                **logprob_mismatch_stats(before["old_log_probs"], batch["rollout_log_probs"], mask)}
    metrics = worker.update_actor(batch.union(worker.compute_ref_log_probs(batch)))
    assert set(expected) == {"actor/entropy", "actor/kl", "rollout/logprob_diff_mean", "rollout/logprob_diff_max"}
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    assert metrics["rollout/logprob_diff_mean"] > 1.0  # the made-up rollout log-probs are far from the policy's
