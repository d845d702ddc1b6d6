"""What a ``vllm.LLM`` was given and what it allocated, for setting two frameworks' engines side by side: the memory
share, the KV cache's blocks, tokens and bytes, and the scheduler's limits. ``gpu_grpo_step.py`` (through
``BenchWorker.bench_engine_facts``) and ``gpu_trl_anchor.py`` write it into their JSON as ``engine``."""
from __future__ import annotations

from typing import Any, Dict

GIB = float(1 << 30)


def vllm_engine_facts(llm: Any) -> Dict[str, Any]:
    """The engine's ``gpu_memory_utilization``, KV-cache blocks x block size = tokens, bytes per token (2 x layers x
    KV heads x head size x element size) and GiB, ``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``.
    A field vLLM does not expose under these names is recorded as the error instead of failing the benchmark."""
    out: Dict[str, Any] = {}
    try:
        import torch

        cfg = llm.llm_engine.vllm_config
        cc, sc, mc, pc = cfg.cache_config, cfg.scheduler_config, cfg.model_config, cfg.parallel_config
        out.update(gpu_memory_utilization=cc.gpu_memory_utilization, block_size=cc.block_size,
                   num_gpu_blocks=cc.num_gpu_blocks, kv_cache_memory_bytes_arg=getattr(cc, "kv_cache_memory_bytes", None),
                   max_num_seqs=sc.max_num_seqs, max_num_batched_tokens=sc.max_num_batched_tokens,
                   max_model_len=mc.max_model_len, dtype=str(mc.dtype))
        kv_dtype = mc.dtype if cc.cache_dtype in (None, "auto") else cc.cache_dtype
        elem = torch.empty((), dtype=kv_dtype).element_size() if isinstance(kv_dtype, torch.dtype) else 1
        per_token = 2 * mc.get_num_layers(pc) * mc.get_num_kv_heads(pc) * mc.get_head_size() * elem
        out["kv_bytes_per_token"] = per_token
        if cc.num_gpu_blocks:
            tokens = cc.num_gpu_blocks * cc.block_size
            out["kv_cache_tokens"] = tokens
            out["kv_cache_gib"] = tokens * per_token / GIB
    except Exception as exc:  # noqa: BLE001 (recorded: a vLLM release that names these differently)
        out["error"] = repr(exc)
    return out
