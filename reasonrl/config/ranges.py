"""The allowed interval of every numeric config field (``load_config`` rejects a value outside it, naming the key,
before anything loads). A new numeric field in ``schema.py`` needs its entry here (``tests/unit/config/test_config.py`` checks)."""
from __future__ import annotations

from typing import Dict

FIELD_RANGES: Dict[str, str] = {
    # The allowed values of every numeric field, as intervals: "[a, b]" closed, "(a, b)" open, "inf" unbounded.
    # load_config rejects a value outside its interval, naming the key, before anything loads.
    "data.train_batch_size": "[1, inf)", "data.val_batch_size": "[1, inf)", "data.val_limit": "[0, inf)",
    "data.max_prompt_length": "[1, inf)", "data.pass_rate_prior": "(0, inf)", "data.pass_rate_floor": "[0, 0.25]",
    "data.pass_rate_band": "[0, 1]",
    "rollout.n": "[1, inf)", "rollout.max_new_tokens": "[1, inf)", "rollout.temperature": "[0, inf)",
    "rollout.top_p": "(0, 1]", "rollout.top_k": "[-1, inf)", "rollout.val_temperature": "[0, inf)",
    "rollout.gpu_memory_utilization": "(0, 1]", "rollout.kv_cache_gb": "(0, inf)",
    "rollout.max_num_seqs": "[0, inf)", "rollout.max_num_batched_tokens": "[0, inf)",
    "rollout.weight_sync_bucket_mb": "[1, inf)", "rollout.seed": "[0, inf)",
    "actor.lr": "[0, inf)", "actor.weight_decay": "[0, inf)", "actor.betas": "[0, 1)", "actor.warmup_steps": "[0, inf)",
    "actor.grad_clip": "[0, inf)", "actor.ppo_epochs": "[1, inf)", "actor.ppo_mini_batch_size": "[0, inf)",
    "actor.micro_batch_size_per_worker": "[1, inf)",
    # *.max_tokens_per_micro_batch (an int >= 0 or "auto") are checked by config/token_budget.py
    "rollout.max_turns": "[1, inf)", "rollout.tensor_parallel_size": "[1, inf)", "rollout.sleep_level": "[0, 2]",
    "tool.timeout_s": "(0, inf)", "tool.memory_mb": "[16, inf)", "tool.max_output_chars": "[1, inf)",
    "tool.concurrency": "[1, inf)", "rollout.stream_chunk_prompts": "[0, inf)",
    "rollout.partial_segment_tokens": "[1, inf)",
    "async_rollout.num_rollout_workers": "[1, inf)", "async_rollout.max_staleness": "[0, inf)",
    "async_rollout.transfer_timeout_s": "(0, inf)", "async_rollout.engine_memory_fraction": "(0, 1)",
    "async_rollout.actor_sm_percent": "[1, 100]",
    "fleet.max_restarts": "[0, inf)", "fleet.watchdog_s": "(0, inf)",
    "fleet.weight_sync_max_diff": "(0, inf)",
    "algorithm.clip_ratio_low": "[0, 1)", "algorithm.clip_ratio_high": "[0, inf)",
    "algorithm.clip_ratio_dual": "[0, inf)",
    "algorithm.kl_coef": "[0, inf)", "algorithm.entropy_coef": "[0, inf)", "algorithm.gamma": "[0, 1]",
    "algorithm.lam": "[0, 1]", "algorithm.max_resample_rounds": "[0, inf)",
    "algorithm.overlong_buffer": "[0, inf)", "algorithm.overlong_penalty": "[0, inf)",
    "algorithm.off_policy.cap": "(0, inf]", "algorithm.off_policy.lower": "[0, 1]",
    "algorithm.off_policy.upper": "[1, inf]",
    "algorithm.pass_k": "[1, inf)", "algorithm.kl_target": "(0, inf)", "algorithm.kl_horizon": "(0, inf)",
    "critic.lr": "[0, inf)", "critic.cliprange_value": "[0, inf)", "critic.warmup_steps": "[0, inf)",
    "reward.workers": "[0, inf)", "reward.timeout_s": "(0, inf)", "reward.max_failed_fraction": "[0, 1]",
    "reward.score_range": "(-inf, inf)",
    "trainer.max_skipped_steps": "[0, inf)",
    "trainer.total_steps": "[0, inf)", "trainer.save_every": "[0, inf)", "trainer.keep_checkpoints": "[0, inf)",
    "trainer.val_every": "[0, inf)", "trainer.num_workers": "[0, inf)", "trainer.seed": "[0, inf)",
    "trainer.log_samples_every": "[0, inf)", "trainer.log_val_samples": "[0, inf)", "trainer.watchdog_max_s": "[0, inf)",
    "trainer.watchdog_factor": "(1, inf)",
    "trainer.watchdog_min_s": "[0, inf)",
    "eval.n": "[1, inf)", "eval.k": "[1, inf)", "eval.limit": "[0, inf)", "eval.temperature": "[0, inf)",
    "eval.top_p": "(0, 1]", "eval.max_new_tokens": "[1, inf)", "eval.batch_size": "[1, inf)",
}
