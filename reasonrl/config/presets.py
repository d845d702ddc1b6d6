"""Presets: plain nested dicts merged under the user's key=value overrides.

Order of layers (later wins): schema defaults -> task preset -> algorithm preset -> size profile -> user.
"""
from __future__ import annotations

from typing import Any, Dict

from .tasks import TASKS, task_preset

# task -> what ``task=`` sets, derived from the task registry (reasonrl/config/tasks.py). No task sets
# ``reward.verifier``: each row picks its own verifier unless the user forces one.
TASK_PRESETS: Dict[str, Dict[str, Any]] = {name: task_preset(name) for name in TASKS}

ALGORITHM_PRESETS: Dict[str, Dict[str, Any]] = {
    "grpo": {"adv_estimator": "grpo", "norm_by_std": True, "use_kl_loss": True},
    "drgrpo": {"adv_estimator": "grpo", "norm_by_std": False, "loss_agg_mode": "seq-mean-token-sum-norm",
               "use_kl_loss": False, "kl_coef": 0.0},
    "rloo": {"adv_estimator": "rloo", "use_kl_loss": False, "kl_in_reward": True},
    "reinforce_pp": {"adv_estimator": "reinforce_pp", "use_kl_loss": False, "kl_in_reward": True},
    "ppo": {"adv_estimator": "gae", "use_kl_loss": False, "kl_in_reward": True, "gamma": 1.0, "lam": 1.0},
    "dapo": {"adv_estimator": "grpo", "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "use_kl_loss": False,
             "kl_coef": 0.0, "loss_agg_mode": "token-mean", "dynamic_sampling": True, "overlong_buffer": 64},
    "gspo": {"adv_estimator": "grpo", "policy_loss": "gspo", "clip_ratio_low": 0.0003, "clip_ratio_high": 0.0004,
             "loss_agg_mode": "seq-mean-token-mean", "use_kl_loss": False, "kl_coef": 0.0},
    # The losses and estimators below: docs/algorithms.md names each one's paper and what the preset takes from it.
    "cispo": {"adv_estimator": "grpo", "policy_loss": "cispo", "clip_ratio_high": 0.28, "loss_agg_mode": "token-mean",
              "use_kl_loss": False, "kl_coef": 0.0},
    "sapo": {"adv_estimator": "grpo", "policy_loss": "sapo", "loss_agg_mode": "seq-mean-token-mean",
             "use_kl_loss": False, "kl_coef": 0.0},
    "gmpo": {"adv_estimator": "grpo", "policy_loss": "gmpo", "clip_ratio_low": 0.4, "clip_ratio_high": 0.4,
             "loss_agg_mode": "seq-mean-token-mean", "use_kl_loss": False, "kl_coef": 0.0},
    "clip_cov": {"adv_estimator": "grpo", "policy_loss": "clip_cov", "loss_agg_mode": "token-mean",
                 "use_kl_loss": False, "kl_coef": 0.0},
    "kl_cov": {"adv_estimator": "grpo", "policy_loss": "kl_cov", "loss_agg_mode": "token-mean",
               "use_kl_loss": False, "kl_coef": 0.0},
    "remax": {"adv_estimator": "remax", "use_kl_loss": False, "kl_coef": 0.0},
    "pass_at_k": {"adv_estimator": "pass_at_k", "pass_k": 4},
}

# With no GPU and no sizes given: a first step of the default command ends within minutes on 2 cores.
CPU_PROFILE: Dict[str, Any] = {
    "data": {"train_batch_size": 4, "val_limit": 16, "max_prompt_length": 384},
    "rollout": {"n": 4, "max_new_tokens": 160},
    "actor": {"micro_batch_size_per_worker": 4},
}
# trainer.profile=laptop: the settings of the CPU learning-parity run (benchmarks/README.md), under which SmolLM2-135M's
# training reward and held-out accuracy on task=arith rose within 740 s on a 2-core CPU: T=0.7 and lr 1e-5 with 4
# mini-batches of 2 prompts x 4 samples (at lr 2e-6, T=1 and one mini-batch the reward barely moves in 7 steps), no KL
# term (no reference model to run). The CLI run of the command: benchmarks/laptop_learning.py, results/.
LAPTOP_PROFILE: Dict[str, Any] = {
    "data": {"train_batch_size": 8, "val_limit": 64, "val_batch_size": 64},
    "rollout": {"n": 4, "temperature": 0.7},
    "actor": {"lr": 1e-5, "ppo_mini_batch_size": 2, "micro_batch_size_per_worker": 32},
    "algorithm": {"use_kl_loss": False},
    "trainer": {"total_steps": 10, "val_every": 5, "val_before_train": True, "save_every": 0},
}
# The command for a run on a laptop with rewards to learn from; the CPU profile's notice points to it.
LAPTOP_COMMAND = "python -m reasonrl.train task=arith trainer.profile=laptop"


def profile_notice(profile: str, task: str) -> str:
    """The start-up line that announces a size profile (empty when none applies)."""
    if profile == "laptop":
        return (f"reasonrl: laptop profile — {LAPTOP_PROFILE['trainer']['total_steps']} steps of task=arith sized "
                "for a 2-core CPU (presets.LAPTOP_PROFILE; what it measured: README.md, Train)")
    if profile != "cpu":
        return ""
    notice = ("reasonrl: no GPU — using the CPU profile (small batch and lengths; set trainer.profile=none or give "
              "sizes to change it)")
    if task == "gsm8k":
        notice += ("\nreasonrl: the default model (SmolLM2-135M) scores about 0 on GSM8K on the CPU profile (most "
                   f"answers are cut off at {CPU_PROFILE['rollout']['max_new_tokens']} tokens): no reward, nothing to "
                   f"learn from. For a run with rewards to learn from on a CPU: {LAPTOP_COMMAND}")
    return notice


# The profile's lengths only shorten: a task preset with a shorter one keeps its own.
PROFILE_LENGTH_CEILINGS = (("data", "max_prompt_length"), ("rollout", "max_new_tokens"))

# Layered over the task/algorithm presets (beneath the size profile and the user) by trainer.mode.
MODE_PRESETS: Dict[str, Dict[str, Any]] = {
    # The engines generate with weights up to async_rollout.max_staleness updates old: correct for it with truncated
    # importance sampling against their log-probs (docs/async.md).
    "async": {"algorithm": {"off_policy": {"correction": "tis", "level": "token"}}},
}
