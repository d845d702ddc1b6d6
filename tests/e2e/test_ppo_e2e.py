"""PPO through the trainer on Ray with 2 actor ranks: the critic group, its warm-up, its checkpoint and resume; DAPO's
dynamic sampling on in the same runs. The trainers run in this process, both in one Ray session (the module's), so
the test pays for one Ray start and no interpreter starts (the command line itself: tests/e2e/test_train_e2e.py)."""
from __future__ import annotations

import pytest
from helpers import fit_and_close, read_jsonl, ray_trainer


def fit(policy, args):
    fit_and_close(ray_trainer([], policy, args))


@pytest.mark.slow
def test_ppo_with_dynamic_sampling_through_the_trainer(ray_session, tiny_policy, tmp_path, capsys):
    """PPO builds the critic group, logs its metrics, honours the critic warm-up, checkpoints into critic/ and resumes
    from it; DAPO's dynamic sampling (on in the same runs) logs its counts and keeps a number of groups the 2 ranks
    divide. (One run for both: each run starts 2 actor ranks and 2 critic ranks, the dearest part; the in-process
    step of DAPO's own preset is tests/unit/config/test_combinations.py's.)"""
    from reasonrl.datasets import prepare

    train_file, val_file = prepare("arith", "train", out_dir=tmp_path), prepare("arith", "test", out_dir=tmp_path)
    run = tmp_path / "ppo"
    common = ["task=arith", "rollout.engine=hf", "trainer.num_workers=2", "trainer.ray_address=local",
              "data.train_batch_size=4", "rollout.n=2", "rollout.max_new_tokens=8", "reward.workers=1",
              f"data.train_files=[{train_file}]", f"data.val_files=[{val_file}]", "trainer.logger=[jsonl]",
              "algorithm=ppo", "algorithm.dynamic_sampling=true", "algorithm.overlong_buffer=4",
              "algorithm.max_resample_rounds=1", f"trainer.output_dir={run}"]
    fit(tiny_policy, common + ["critic.warmup_steps=1", "trainer.total_steps=2", "trainer.save_every=1"])
    first, second = read_jsonl(run / "metrics.jsonl")
    for r in (first, second):
        for key in ("critic/value_loss", "critic/vf_clip_frac", "critic/explained_variance", "critic/grad_norm",
                    "timing_s/values", "timing_s/update_critic"):
            assert key in r, key
        assert 1 <= r["dynamic_sampling/rounds"] <= 2  # at most one extra round
        assert r["dynamic_sampling/groups_kept"] % 2 == 0  # divisible by the 2 ranks
    assert "timing_s/update_actor" not in first and "actor/pg_loss" not in first  # warm-up: critic only
    assert "timing_s/update_actor" in second
    ckpt = run / "checkpoints" / "step_000002" / "critic"
    assert (ckpt / "value_head.safetensors").exists() and (ckpt / "critic_optim.pt").exists()
    capsys.readouterr()
    fit(tiny_policy, common + ["trainer.total_steps=3"])
    assert f"resumed from {run / 'checkpoints' / 'step_000002'}" in capsys.readouterr().out
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]
