"""The RunPlan (reasonrl/config/plan.py): torch-free, built for named hardware, finished by the model's facts, and
never writing the config it reads."""
from __future__ import annotations

import subprocess
import sys

import pytest

from reasonrl.config import ConfigError, load_config
from reasonrl.config.device_defaults import Hardware
from reasonrl.config.model_facts import ModelFacts
from reasonrl.config.plan import RunPlan


def test_the_plan_and_the_model_facts_import_no_torch():
    code = ("import sys, reasonrl.config.plan, reasonrl.config.model_facts, reasonrl.memory; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_gpu_count_is_an_argument_and_async_rollout_gpus_are_not_actors():
    cfg, _ = load_config(["trainer.mode=async", "async_rollout.num_rollout_workers=2", "data.train_batch_size=6",
                          "rollout.n=2"], cuda_available=True)
    plan = RunPlan.build(cfg, Hardware("cuda", gpu_count=8))
    assert plan.world_size == 6 and plan.rollout_workers == 2  # 8 GPUs, 2 of them generating


def test_sync_kind_bucket_and_context_are_plan_fields():
    cfg, _ = load_config(["rollout.weight_sync_bucket_mb=3", "data.max_prompt_length=100",
                          "rollout.max_new_tokens=20", "eval.max_new_tokens=50"], cuda_available=False)
    plan = RunPlan.build(cfg)
    assert plan.bucket_bytes == 3 * 1048576 and plan.lora_sync == "off"
    assert plan.max_model_len == 150  # the engine serves validation too: 100 + max(20, 50)
    adapter, _ = load_config(["actor.lora.rank=4"], cuda_available=False)
    merged, _ = load_config(["actor.lora.rank=4", "actor.lora.merge_for_rollout=true"], cuda_available=False)
    assert (RunPlan.build(adapter).lora_sync, RunPlan.build(adapter).engine_sleep_level) == ("adapter", 1)
    assert (RunPlan.build(merged).lora_sync, RunPlan.build(merged).engine_sleep_level) == ("merged", 2)


def test_a_replica_takes_two_generate_calls_at_once_only_in_the_in_engine_mode():
    fleet = ["trainer.mode=async", "fleet.enabled=true", "fleet.continuous=true", "rollout.engine=vllm"]
    modes = {"none": [], "segments": ["rollout.partial=true"],
             "in_engine": ["rollout.partial=true", "rollout.partial_mode=in_engine"]}
    calls = {name: RunPlan.build(load_config(fleet + keys, cuda_available=False)[0]).replica_calls
             for name, keys in modes.items()}
    assert calls == {"none": 1, "segments": 1, "in_engine": 2}


def test_with_model_checks_the_context_and_fixes_auto_budgets_without_writing_the_config():
    cfg, _ = load_config(["data.max_prompt_length=100", "rollout.max_new_tokens=30",
                          "actor.max_tokens_per_micro_batch=auto"], cuda_available=False)
    plan = RunPlan.build(cfg)
    short = ModelFacts.from_config_json("m", {"max_position_embeddings": 120})
    with pytest.raises(ConfigError, match=r"\(100\) \+ rollout.max_new_tokens \(30\) = 130 exceeds the model's "
                                          r"context of 120 tokens"):
        plan.with_model(short)
    facts = ModelFacts.from_config_json("m", {"text_config": {"max_position_embeddings": 4096}, "num_hidden_layers": 2,
                                              "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10})
    assert (facts.layers, facts.hidden, facts.heads, facts.kv_heads, facts.vocab, facts.max_positions) == \
        (2, 64, 4, 4, 10, 4096)
    final = plan.with_model(facts, {"actor.max_tokens_per_micro_batch": 777})
    assert final.model is facts and not final.batch.auto_budget_keys
    run = final.run_config(cfg)
    assert run.actor.max_tokens_per_micro_batch == 777 and run.model.attn_implementation == "sdpa"
    assert cfg.actor.max_tokens_per_micro_batch == "auto" and cfg.model.attn_implementation == "auto"


def test_a_model_without_config_json_states_nothing_and_the_memory_plan_asks_for_it(tmp_path):
    facts = ModelFacts.read(str(tmp_path))
    assert facts.max_positions is None and not facts.config
    with pytest.raises(ConfigError, match="the memory plan needs the model's config.json"):
        facts.require_config()
