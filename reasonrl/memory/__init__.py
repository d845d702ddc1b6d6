"""Will it fit? The expected peak memory per GPU in each phase of a step, from the config and ``config.json`` alone.

Pure arithmetic (no torch, no CUDA): ``plan_memory`` turns a ``Config``, the model's ``config.json`` dict, the
device's memory in bytes and the run's plan (``reasonrl.config.plan.RunPlan``: world size, tensor-parallel size,
critic or not, the batch rows, the passes, the weight sync; default ``one_gpu_plan``) into a ``MemoryPlan``:
for each phase of a colocated step (rollout, old log-probs, reference, critic values, critic update, actor update,
weight sync) the terms that are on the device then, in bytes, their total and whether it fits. ``render_plan`` prints
it as a table; ``largest_fitting_token_budget`` and ``fit_suggestions`` say what would make a layout fit.

- ``shape.py``: the model's numbers from ``config.json``, its parameter count and one layer's saved activations;
- ``terms.py``: the rule behind every other term, one function each (its docstring states the rule);
- ``plan.py``: which terms are on the device in which phase (``plan_memory``);
- ``fit.py``: the table and the "what would make it fit" search;
- ``auto.py``: ``*.max_tokens_per_micro_batch=auto``, the largest token budget that fits (``resolve_auto_budgets``);
- ``rollout_worker.py``: an async rollout worker's device, the engine alone (``plan_rollout_worker``).
- ``shared_gpu.py``: a GPU an actor rank shares with a rollout replica (``async_rollout.share_devices``), the
  replica's engine resident in every phase (``plan_memory`` adds it).

docs/performance.md ("Will it fit? The memory plan") compares the plan with the H200 runs in benchmarks/results/.

Notation: P parameters, W data-parallel ranks, T ranks per vLLM engine, h hidden size, i intermediate size, kv the
key/value width (kv heads x head dim), V vocabulary, L layers, dt bytes of the compute dtype (2 for bf16), N tokens in
one micro-batch's forward, c tokens of one log-prob chunk (``reasonrl/models/fused_logprob.py``).
"""
from __future__ import annotations

from .auto import (AUTO_DEVICE_SHARE, AutoBudgetError, describe_budgets, device_memory_bytes, resolve_auto_budgets,
                   resolve_run_budgets)
from .fit import fit_suggestions, largest_fitting_token_budget, render_plan
from .plan import MemoryPlan, PhasePlan, one_gpu_plan, plan_memory
from .rollout_worker import plan_rollout_worker
from .shape import ModelShape
from .terms import COMPILE_ACTIVATION_RATIO, CUDA_CONTEXT_BYTES, GIB, LOGPROB_CHUNK_TOKENS

__all__ = ["plan_memory", "render_plan", "largest_fitting_token_budget", "fit_suggestions", "resolve_auto_budgets",
           "describe_budgets", "resolve_run_budgets", "device_memory_bytes", "AutoBudgetError", "AUTO_DEVICE_SHARE",
           "plan_rollout_worker", "MemoryPlan",
           "PhasePlan", "one_gpu_plan", "ModelShape", "GIB", "COMPILE_ACTIVATION_RATIO", "CUDA_CONTEXT_BYTES",
           "LOGPROB_CHUNK_TOKENS"]
