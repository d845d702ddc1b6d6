"""The memory plan of ``async_rollout.share_devices`` (reasonrl/memory/shared_gpu.py): the replica's engine resident
beside the actor in every phase, figures derived by hand for a 1.5B bf16 model on an 80 GiB GPU (fits at an engine
fraction of 0.3, not at 0.9, and the refusal names the keys and the figures before anything loads); with separate
pools each pool is planned on its own."""
from __future__ import annotations

import re

import pytest
from helpers import gpu_plan
from memory_runs import QWEN_1P5B, config

from reasonrl.config import ConfigError
from reasonrl.memory import GIB, fit_suggestions, plan_memory, plan_rollout_worker

BEYOND = 2.96 * GIB  # a vLLM replica's measured memory beyond its share (shared_gpu.VLLM_REPLICA_BEYOND_SHARE_BYTES)

P = 1543714304  # Qwen2.5-1.5B's parameters (test_memory_plan.py counts them)
DEVICE = 80 * GIB
# GRPO without the KL term (no reference copy), bf16, 16 prompts x 8 samples of 256 + 1024 tokens, 4 rows a micro-batch
WORKLOAD = ["algorithm.use_kl_loss=false", "model.dtype=bfloat16", "data.train_batch_size=16", "rollout.n=8",
            "data.max_prompt_length=256", "rollout.max_new_tokens=1024", "eval.max_new_tokens=1024",
            "actor.micro_batch_size_per_worker=4", "trainer.mode=async", "fleet.enabled=true"]


def planned(*args):
    cfg = config(*WORKLOAD, *args)
    plan = gpu_plan(cfg, 1)
    run = plan.run_config(cfg)
    return run, plan, plan_memory(run, QWEN_1P5B, DEVICE, plan)


def shared(fraction):
    return planned("async_rollout.share_devices=true", f"async_rollout.engine_memory_fraction={fraction}")


def test_the_replica_engine_is_resident_in_every_phase_by_hand():
    _, _, memory = shared(0.3)
    assert [p.name for p in memory.phases] == ["rollout", "update", "weight_send"]
    for phase in memory.phases:  # never asleep: its weights P x 2 bytes and the rest of 0.3 x 80 GiB as KV cache
        assert phase.terms["replica engine weights"] == 2 * P
        assert phase.terms["replica engine KV cache + workspace"] == pytest.approx(0.3 * DEVICE - 2 * P)
        assert phase.terms["replica engine beyond its share (CUDA graphs, measured)"] == BEYOND
        assert phase.overhead == 2 * GIB  # two processes on the GPU: the actor rank and the replica
    idle = memory.phase("rollout")  # the actor between updates: fp32 weights 4P + AdamW moments 8P, the engine
    assert idle.total == pytest.approx(12 * P + 0.3 * DEVICE + BEYOND + 2 * GIB)  # 17.25 + 24 + 2.96 + 2 = 46.21 GiB
    assert idle.total / GIB == pytest.approx(46.21, abs=0.01)
    # the weight phase also holds the replica's receive buffer: the largest full parameter (the embedding, V h x 2
    # bytes = 151936 x 1536 x 2 = 466,747,392) is larger than the 256 MiB bucket
    send = memory.phase("weight_send").terms
    assert send["replica weight receive buffer (one packed bucket)"] == 151936 * 1536 * 2


def test_each_shared_phase_is_the_trainers_plus_the_engines_share():
    _, _, alone = planned()  # separate pools: the actor's GPU has no engine
    assert not any(k.startswith("replica") or k.startswith("engine") for p in alone.phases for k in p.terms)
    _, _, both = shared(0.3)
    for name in ("rollout", "update"):
        assert both.phase(name).total == pytest.approx(alone.phase(name).total + 0.3 * DEVICE + BEYOND + GIB)


def test_two_replicas_a_gpu_are_each_resident_with_a_context_of_their_own():
    _, _, one = shared(0.2)
    _, plan, two = planned("async_rollout.share_devices=true", "async_rollout.engine_memory_fraction=0.2",
                           "async_rollout.num_rollout_workers=2")
    assert plan.replicas_per_device == 2
    for name in ("rollout", "update"):  # one more engine: 0.2 x 80 GiB, its measured excess and one more context
        assert two.phase(name).total == pytest.approx(one.phase(name).total + 0.2 * DEVICE + BEYOND + GIB)
    terms = two.phase("update").terms
    assert terms["replica 1 engine weights"] == terms["replica 2 engine weights"] == 2 * P
    assert "replica engine weights" not in terms
    assert two.phase("update").overhead == 3 * GIB  # the actor rank and two replicas


def test_fits_at_0_3_and_not_at_0_9():
    assert shared(0.3)[2].fits  # update 42.29 (the trainer alone) + 24 + 2.96 + 1 = 70.25 GiB of 80 (at 0.4: 78.25)
    _, _, full = shared(0.9)
    # even the idle actor does not fit: 12P (17.25 GiB) + 0.9 x 80 (72 GiB) + 2.96 + 2 contexts = 94.21 GiB > 80
    assert not full.phase("rollout").fits and full.phase("rollout").total / GIB == pytest.approx(94.21, abs=0.01)


def test_separate_pools_are_each_checked_on_their_own():
    run, plan, actor = planned("rollout.gpu_memory_utilization=0.9")
    rollout = plan_rollout_worker(run, QWEN_1P5B, DEVICE, plan)
    assert actor.fits and rollout.fits  # 0.9 of a GPU of its own is the engine alone: 72 + 0.43 + 1 GiB
    assert rollout.phase("weight_receive").total == pytest.approx(0.9 * DEVICE + 151936 * 1536 * 2 + GIB)


def test_the_trainer_check_refuses_a_shared_gpu_naming_the_keys_and_figures():
    from reasonrl.trainer.model_checks import check_memory_plan

    run, plan, _ = shared(0.9)
    printed = []
    expected = ("the memory plan does not fit the device's 80.0 GiB (async_rollout.share_devices=true: each GPU "
                "holds an actor rank and a replica's engine, awake together; async_rollout.engine_memory_fraction=0.9 "
                "gives the engine 72.0 GiB of 80.0, the trainer the rest): rollout 94.2 GiB, update 118.2 GiB, "
                "weight_send 96.0 GiB; each of these would make it fit: async_rollout.engine_memory_fraction=0.4")
    with pytest.raises(ConfigError, match=re.escape(expected)):
        check_memory_plan(run, plan, QWEN_1P5B, DEVICE, echo=printed.append)
    assert "replica engine weights" in printed[0] and len(printed) == 1  # no separate rollout GPU is planned
    run, plan, _ = shared(0.3)
    check_memory_plan(run, plan, QWEN_1P5B, DEVICE, echo=printed.append)  # fits: printed, not refused
    assert fit_suggestions(run, QWEN_1P5B, DEVICE, plan) == []


def test_an_engine_share_too_small_to_start_names_the_fraction():
    _, _, memory = shared(0.02)  # 1.6 GiB: less than the engine's own 2P = 2.88 GiB of weights
    assert not memory.fits
    assert memory.notes and memory.notes[0].startswith("vLLM cannot start: async_rollout.engine_memory_fraction=0.02 "
                                                       "gives 1.6 GiB, its weights take 2.9 GiB")


def test_workers_of_a_shared_gpu_get_expandable_segments_unless_the_user_chose():
    from reasonrl.memory.shared_gpu import allocator_env

    assert allocator_env(True, "cuda", {}) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert allocator_env(True, "cuda", {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}) == {}  # the user's
    assert allocator_env(False, "cuda", {}) == {}  # colocated or separate pools: torch's default allocator
    assert allocator_env(True, "cpu", {}) == {}
