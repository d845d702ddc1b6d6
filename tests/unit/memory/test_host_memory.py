"""What the run keeps in host memory, and what it no longer needs to: the bf16 reference (``ref.param_dtype``), the
engine's sleep level (``rollout.sleep_level``) and the memory plan's host phase (``reasonrl.memory.plan``). The
exactly sized offload arena is tested with the offload moves (``tests/unit/memory/test_offload.py``)."""
from __future__ import annotations

import pytest
import torch
from helpers import free_port, gpu_plan, make_tiny_causal_lm
from memory_runs import QWEN_1P5B, QWEN_7B, RESULTS, step_config

from reasonrl.config import ConfigError, load_config
from reasonrl.config.plan import engine_sleep_level


def test_a_bf16_reference_computes_exactly_what_fp32_shards_cast_to_bf16_compute_in_half_the_bytes(tmp_path):
    from reasonrl.workers.distributed import init_distributed
    from reasonrl.workers.policy import load_sharded_lm, reference_param_dtype

    auto, _ = load_config(["model.dtype=bfloat16"], cuda_available=False)
    fp32, _ = load_config(["model.dtype=bfloat16", "ref.param_dtype=float32"], cuda_available=False)
    assert reference_param_dtype(auto, torch.bfloat16) == torch.bfloat16
    assert reference_param_dtype(fp32, torch.bfloat16) == torch.float32
    assert reference_param_dtype(auto, torch.float32) == torch.float32  # fp32 compute (the CPU default): unchanged
    mesh = init_distributed(0, 1, "127.0.0.1", free_port(), "cpu")
    path = make_tiny_causal_lm(tmp_path / "lm", seed=3)  # a float32 checkpoint: the bf16 load rounds it
    models = {name: load_sharded_lm(cfg, path, mesh, "cpu", torch.bfloat16, False,
                                    param_dtype=reference_param_dtype(cfg, torch.bfloat16))
              for name, cfg in (("bf16", auto), ("fp32", fp32))}
    nbytes = {name: sum(p.to_local().numel() * p.element_size() for p in m.parameters())
              for name, m in models.items()}
    assert {p.dtype for p in models["bf16"].parameters()} == {torch.bfloat16}
    assert nbytes["bf16"] * 2 == nbytes["fp32"]
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = {name: m(input_ids=ids).logits for name, m in models.items()}
    assert torch.equal(logits["bf16"], logits["fp32"])  # the same rounding, once at load or at every gather


def test_sleep_level_auto_discards_the_weights_only_when_every_sync_refills_them():
    def level(*args):
        return engine_sleep_level(load_config(list(args), cuda_available=False)[0])

    assert level() == 2  # full fine-tuning: each sync sends every weight
    assert level("actor.lora.rank=8") == 1  # adapter-only: the base is never sent again
    assert level("actor.lora.rank=8", "actor.lora.merge_for_rollout=true") == 2  # merged: every weight
    assert level("rollout.sleep_level=1") == 1
    with pytest.raises(ConfigError, match="rollout.sleep_level.*adapter-only"):
        load_config(["actor.lora.rank=8", "rollout.sleep_level=2"], cuda_available=False)
    with pytest.raises(ConfigError, match="config key 'rollout.sleep_level'"):
        load_config(["rollout.sleep_level=3"], cuda_available=False)
    with pytest.raises(ConfigError, match="config key 'ref.param_dtype'"):
        load_config(["ref.param_dtype=bfloat16"], cuda_available=False)


# ------------------------------------------------------------------ the host plan, by hand (Qwen2.5-7B on one H200)

# Qwen/Qwen2.5-7B-Instruct's numbers: per layer attention 2 h q + 2 h kv + qkv bias = 25690112 + 3670016 + 4608,
# MLP 3 h i = 203685888, norms 2 h = 7168 -> 233057792; x 28 + embedding and untied head 2 V h + final norm h
# (1089998336) -> P = 7615616512 (QWEN_7B: tests/memory_runs.py).
P_7B = 7615616512
NODE = 125.85 * (1 << 30)  # what Ray saw of the H200 machine's 128 GiB (benchmarks/README.md, ninth session)
FULL_OFFLOAD = ("model.dtype=bfloat16", "rollout.engine=vllm", "actor.offload_params=true",
                "actor.offload_optimizer=true", "ref.offload_params=true")


def _gpu_config(*overrides):
    return load_config(list(overrides), cuda_available=True)[0]


def test_pinned_blocks_are_the_next_power_of_two():
    from reasonrl.memory.host import pinned_block_bytes

    # one MLP projection of the 7B in fp32 (18944 x 3584 x 4 = 271581184 bytes) takes 512 MiB of pinned memory
    assert pinned_block_bytes(271581184) == 1 << 29
    assert pinned_block_bytes(1 << 20) == 1 << 20 and pinned_block_bytes((1 << 20) + 1) == 1 << 21
    assert pinned_block_bytes(0.5) == 1


def test_the_7b_full_offload_fits_the_host_with_the_arena_a_bf16_reference_and_level_2_sleep():
    from reasonrl.memory import GIB
    from reasonrl.memory.host import plan_host_memory

    plan = plan_host_memory(_gpu_config(*FULL_OFFLOAD), QWEN_7B, NODE)
    assert plan.terms == {"actor weights (fp32 shards, pinned arena)": 4 * P_7B,
                          "actor AdamW moments (2 x fp32, pinned arena)": 8 * P_7B,
                          "reference weights (dt shards, pinned arena)": 2 * P_7B}  # level 2: no engine copy
    assert plan.total / GIB == pytest.approx(99.30, abs=0.01)  # 14 P
    assert plan.limit / GIB == pytest.approx(0.95 * 125.85) and plan.fits
    two_ranks = plan_host_memory(_gpu_config(*FULL_OFFLOAD), QWEN_7B, NODE, world_size=2)
    assert two_ranks.total == plan.total  # each rank holds half, both on this host
    assert plan_host_memory(_gpu_config(*FULL_OFFLOAD), QWEN_7B, NODE, world_size=2, ranks_on_host=1).total \
        == plan.total / 2


def test_the_ninth_sessions_layout_does_not_fit_and_the_check_names_what_would():
    """fp32 reference, level-1 sleep: 16 P plus the sleeping engine's pinned copy. Per layer in bf16 qkv 33030144 ->
    2^25, o 25690112 -> 2^25, gate_up 271581184 -> 2^29, down 135790592 -> 2^28, two norms and the qkv bias 8192,
    8192, 16384 -> 872448000 x 28 = 24428544000; embedding and head (V h = 544997376) x 2 bytes -> 2^31 each, final
    norm 8192: 28723519488 bytes (26.75 GiB, for 14.19 GiB of weights)."""
    from reasonrl.memory import GIB
    from reasonrl.memory.host import plan_host_memory, sleeping_engine_bytes
    from reasonrl.memory.shape import ModelShape
    from reasonrl.trainer.model_checks import check_memory_plan

    assert sleeping_engine_bytes(ModelShape.from_config_json(QWEN_7B), 2, 1) == 28723519488
    cfg = _gpu_config(*FULL_OFFLOAD, "ref.param_dtype=float32", "rollout.sleep_level=1")
    plan = plan_host_memory(cfg, QWEN_7B, NODE)
    assert plan.total == 16 * P_7B + 28723519488 and plan.total / GIB == pytest.approx(140.23, abs=0.01)
    assert not plan.fits
    printed = []
    with pytest.raises(ConfigError) as err:
        check_memory_plan(cfg, gpu_plan(cfg), QWEN_7B, 139.8 * GIB, echo=printed.append, host_bytes=NODE)
    message = str(err.value)
    assert "host memory plan does not fit: 140.2 GiB" in message and "119.6 GiB" in message
    # alone: level 2 leaves 16 P = 113.5; keeping the optimizer 8 P + 26.75 = 83.5, the actor 12 P + 26.75 = 111.9,
    # the reference 12 P + 26.75 = 111.9 GiB; the bf16 reference alone leaves 14 P + 26.75 = 126.0 (over)
    assert message.split("each of these would fit the host (check the GPU plan too): ")[1].split(";")[0] == \
        "rollout.sleep_level=2, actor.offload_optimizer=false, actor.offload_params=false, ref.offload_params=false"
    assert any(line.startswith("host memory plan (1 rank(s)") for line in printed)
    hatch = _gpu_config(*FULL_OFFLOAD, "ref.param_dtype=float32", "rollout.sleep_level=1",
                        "trainer.ignore_memory_plan=true")
    check_memory_plan(hatch, gpu_plan(hatch), QWEN_7B, 139.8 * GIB, echo=printed.append, host_bytes=NODE)  # the escape hatch starts anyway


def test_an_adapter_only_lora_sync_sleeps_at_level_1_and_plans_the_engines_host_copy():
    from reasonrl.memory.host import plan_host_memory, sleeping_engine_bytes
    from reasonrl.memory.shape import ModelShape

    plan = plan_host_memory(_gpu_config("model.dtype=bfloat16", "rollout.engine=vllm", "actor.lora.rank=16"),
                            QWEN_7B, NODE)
    assert plan.terms == {"sleeping engine weights (level 1, pinned, power-of-two blocks)":
                          sleeping_engine_bytes(ModelShape.from_config_json(QWEN_7B), 2, 1)}
    merged = plan_host_memory(_gpu_config("model.dtype=bfloat16", "rollout.engine=vllm", "actor.lora.rank=16",
                                          "actor.lora.merge_for_rollout=true"), QWEN_7B, NODE)
    assert merged.terms == {}  # every sync resends the merged weights: level 2


def test_a_fleet_plans_actor_rank_0s_copy_of_the_published_weights_once():
    from reasonrl.memory.host import plan_host_memory

    fleet = ("model.dtype=bfloat16", "rollout.engine=vllm", "trainer.mode=async", "fleet.enabled=true")
    term = "published weights (actor rank 0, pinned arena)"
    plan = plan_host_memory(_gpu_config(*fleet), QWEN_7B, NODE, world_size=2)
    assert plan.terms == {term: 2 * P_7B}  # bf16: 2 bytes a parameter, rank 0 only though two ranks share the host
    from reasonrl.memory.shape import ModelShape

    cfg = _gpu_config(*fleet, "actor.lora.rank=16")
    pa = ModelShape.from_config_json(QWEN_7B).lora_parameters(16, cfg.actor.lora.target_modules)
    assert 0 < pa < P_7B / 100
    assert plan_host_memory(cfg, QWEN_7B, NODE).terms[term] == 4 * pa  # the adapters alone travel, in fp32


def test_doctor_plan_refuses_a_layout_that_fits_the_gpu_but_not_the_host(tmp_path, capsys):
    import json

    from reasonrl.doctor.plan import plan_main

    (tmp_path / "config.json").write_text(json.dumps({**QWEN_7B, "architectures": ["Qwen2ForCausalLM"]}))
    flags = [f"model.path={tmp_path}", *FULL_OFFLOAD, "model.gradient_checkpointing=true"]
    assert plan_main(flags + ["ref.param_dtype=float32", "rollout.sleep_level=1"], 139.8, 1, 125.85) == 1
    out = capsys.readouterr().out
    assert "140.23   DOES NOT FIT" in out and "does not fit: the host (140.2 GiB" in out
    # the arena, a bf16 reference, level 2: 99.3 GiB fit the host; the GPU's update does not with AdamW's foreach
    # step (sqrt(v) of all 7.6B parameters at once), and does with the fused step (auto's choice on a GPU)
    assert plan_main(flags + ["actor.adamw_impl=foreach"], 139.8, 1, 125.85) == 1
    out = capsys.readouterr().out
    assert "99.30   fits" in out and "does not fit; each of these alone would" in out
    assert plan_main(flags, 139.8, 1, 125.85) == 0
    out = capsys.readouterr().out
    assert "99.30   fits" in out and "AdamW step" not in out
    assert plan_main(flags, 139.8, 1, -1.0) == 2


@pytest.mark.parametrize("name, slack_gib", [("s11_lora16_merged", 5.0), ("s11_1p5b_full_fused", 5.0),
                                             ("s11_7b_full_fused", 5.0), ("s11_7b_full_offload_fused", 5.0),
                                             ("s11_7b_lora64", 7.5)])
def test_the_host_plan_against_the_eleventh_sessions_runs(name, slack_gib):
    """The host plan against the worker's largest VmRSS over the timed step (benchmarks/results/s11_*.json). The
    plan leaves out the process itself: with no host terms (LoRA merged, 1.5B full) the worker held 3.9 GiB, and
    the plan plus that much covers the 7B runs (75.11 GiB for 70.93 planned; 103.42 for 99.30 with everything
    offloaded, where the tenth session's run with a foreach AdamW whose arena could not be page-locked was killed
    at 115.25). The level-1 sleeping engine of 7B LoRA rank 64 held more than planned: vLLM backed up 15.26 GiB for
    the 14.19 GiB of weights (its LoRA slots and other buffers are not in ``sleeping_engine_bytes``), 33.55 GiB for
    26.75 planned."""
    import json

    from reasonrl.memory.host import plan_host_memory

    run = json.loads((RESULTS / f"{name}.json").read_text())
    shape = QWEN_7B if run["args"]["shape"] == "qwen2.5-7b" else QWEN_1P5B
    cfg = step_config(run["args"], run["ref_param_dtype"], run["adamw_impl"])
    planned = plan_host_memory(cfg, shape, 125.85 * 2**30).total / 2**30
    measured = max(v[0]["host_rss_gib"] for v in run["steps"][0]["memory_gib"].values())
    assert planned <= measured <= planned + slack_gib, (planned, measured)
