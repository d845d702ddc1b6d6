"""The recorded H200 runs (benchmarks/results/) and the model shapes they used, with the configs their scripts built:
shared by the device plan's tests (tests/unit/memory/test_memory_plan.py) and the host plan's (tests/unit/memory/test_host_memory.py)."""
from __future__ import annotations

import ast
from pathlib import Path

from reasonrl.config import load_config

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"

# Qwen/Qwen2.5-1.5B-Instruct's architecture numbers, copied from benchmarks/gpu_grpo_step.py's SHAPES table (the
# random-weight model every H200 run in benchmarks/results/ used); model_type qwen2: q/k/v carry biases.
QWEN_1P5B = dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                 tie_word_embeddings=True)

# Qwen/Qwen2.5-7B-Instruct's numbers (reasonrl/bench/shapes.py's SHAPES): untied embeddings.
QWEN_7B = dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
               tie_word_embeddings=False)


def config(*overrides: str, cuda: bool = True):
    """A config for the plan, on CUDA unless ``cuda`` is false: no device profile, the vLLM engine, ``overrides``."""
    cfg, _ = load_config(["trainer.profile=none", f"trainer.device={'cuda' if cuda else 'cpu'}",
                          "rollout.engine=vllm", *overrides], cuda_available=cuda)
    return cfg


def step_config(args, ref_param_dtype="float32", adamw_impl="foreach"):
    """The config gpu_grpo_step.py built (its config_overrides), from the JSON's recorded args. The reference's dtype:
    the JSON's ``ref_param_dtype`` (runs before the tenth session held it in fp32); AdamW's implementation: the
    JSON's ``adamw_impl`` (runs before the eleventh session ran torch's default on CUDA, foreach)."""
    overrides = [f"ref.param_dtype={ref_param_dtype}", f"actor.adamw_impl={adamw_impl}", "model.dtype=bfloat16",
                 f"model.gradient_checkpointing={args['gradient_checkpointing']}",
                 f"data.train_batch_size={args['prompts']}", f"data.max_prompt_length={args['prompt_len']}",
                 f"rollout.tensor_parallel_size={args.get('tp', 1)}", f"rollout.n={args['n']}",
                 f"rollout.max_new_tokens={args['response_len']}",
                 f"rollout.gpu_memory_utilization={args['gpu_memory_utilization']}", "rollout.free_cache_engine=true",
                 f"actor.micro_batch_size_per_worker={args['micro_batch']}",
                 f"actor.ppo_mini_batch_size={args['mini_batch']}", "algorithm.use_kl_loss=true",
                 f"actor.use_packing={args.get('packing', 'false')}",
                 f"actor.max_tokens_per_micro_batch={args.get('max_tokens_per_micro_batch', 0)}",
                 *ast.literal_eval(args.get("set", "[]"))]
    return config(*overrides)
