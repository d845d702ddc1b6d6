"""``benchmarks/gpu_trl_anchor.py``'s parts that need no GPU and no TRL import: Hugging Face's ``datasets`` past the
repository's own ``datasets/`` folder, the step benchmark's prompts, TRL's ``GRPOConfig`` arguments for a mode, the
JSON of one mode (``ModeRecord``: per-step records, their mean, rewritten after each step), the command line and the
parent's loop that runs each mode in a child process of its own under one deadline.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import importlib.metadata
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from reasonrl.bench.records import RESULTS, write
from reasonrl.bench.shapes import SHAPES

MODES = ("colocate", "generate")
MEAN_KEYS = ("seconds", "generate_s", "sync_weights_s", "prepare_inputs_s", "score_s", "update_s",
             "step_completion_tokens_per_s", "step_total_tokens_per_s")
NOTES = [
    "step seconds: on_step_end to on_step_end (the first timed step starts at the warm-up's end), device "
    "synchronised; generate_s = TRL's vLLM.generate or transformers.generate block; prepare_inputs_s = "
    "TRL's _prepare_inputs (generation, weight sync, rewards, old log-probs when vLLM's importance-sampling "
    "correction is on, ref log-probs); update_s = step - prepare_inputs (the 64 micro-batches' forward, "
    "backward and the optimizer step); score_s = prepare_inputs - generate - sync_weights.",
    "memory: peak_allocated is torch's allocator peak per step (in colocate mode it counts vLLM's sleep-mode "
    "pool too); peak_device_used_sampled is cudaMemGetInfo's used memory, sampled at each TRL profiling "
    "block's end and at step end (physical, whole device).",
    "responses are forced to their length with EOS ignored: vLLM ignore_eos (colocate; per-sample max_tokens "
    "with --length-dist longtail), transformers min_new_tokens (generate); tokens/s count response tokens "
    "(the sum of the samples' lengths) unless named total.",
    "TRL loads the policy (and the reference) in fp32 by default and trains under bf16 autocast.",
]
"""The parent's ``notes``: what each JSON figure measures."""


def import_hf_datasets(root: Path):
    """Hugging Face's ``datasets``, not the repository's top-level ``datasets/`` folder: imported with ``root`` (the
    checkout) taken off ``sys.path`` for a moment."""
    mod = sys.modules.get("datasets")
    if mod is not None and hasattr(mod, "Dataset"):
        return mod
    sys.modules.pop("datasets", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != os.path.realpath(str(root))]
    try:
        return importlib.import_module("datasets")
    finally:
        sys.path[:] = saved


def make_prompts(vocab_size: int, prompts: int, prompt_len: int) -> List[List[int]]:
    """The step benchmark's prompts: the same draw (``random.Random(0)``, ids 1 .. V-2; V-1 is eos = pad)."""
    rng = random.Random(0)
    return [[rng.randrange(1, vocab_size - 1) for _ in range(prompt_len)] for _ in range(prompts)]


def package_versions(names: Iterable[str] = ("trl", "datasets", "transformers", "accelerate", "vllm")
                     ) -> Dict[str, Optional[str]]:
    """Each installed distribution's version (None where not installed)."""
    out: Dict[str, Optional[str]] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


# ----------------------------------------------------------------------------- TRL's config for a mode

def grpo_config_kwargs(mode: str, args, on_gpu: bool, out_dir: Path) -> Dict[str, Any]:
    """``GRPOConfig``'s arguments: one optimizer step per ``prompts x n`` completions in micro-batches of
    ``micro_batch``, all generated at once; vLLM colocate (``ignore_eos``) or plain ``generate``
    (``min_new_tokens``) for full-length responses; ``warmup + steps`` steps of the mode."""
    n_completions = args.prompts * args.n
    steps = args.steps if mode == "colocate" else args.generate_steps
    if mode == "colocate":
        gen_kwargs: Dict[str, Any] = {"ignore_eos": True}  # vLLM SamplingParams
    else:
        gen_kwargs = {"min_new_tokens": args.response_len}  # transformers GenerationConfig / generate
    kwargs: Dict[str, Any] = dict(
        output_dir=str(out_dir), per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=n_completions // args.micro_batch, generation_batch_size=n_completions,
        num_generations=args.n, max_completion_length=args.response_len, beta=args.beta, learning_rate=1e-6,
        num_iterations=1, bf16=on_gpu, gradient_checkpointing=False, max_steps=args.warmup + steps, logging_steps=1,
        save_strategy="no", report_to="none", seed=1, use_cpu=not on_gpu, dataloader_num_workers=0,
        temperature=1.0, top_p=1.0, generation_kwargs=gen_kwargs, use_vllm=(mode == "colocate"),
    )
    if mode == "colocate":  # TRL's default (True) adds an old-log-prob pass; False: the same passes as ours
        kwargs["vllm_importance_sampling_correction"] = args.is_correction
        kwargs.update(vllm_mode="colocate", vllm_gpu_memory_utilization=args.gpu_memory_utilization,
                      vllm_enable_sleep_mode=bool(on_gpu and args.sleep_mode),
                      vllm_max_model_length=args.prompt_len + args.response_len)
    return kwargs


def config_record(a, args, timed_steps: int, model_dtype: str, ref_model: str) -> Dict[str, Any]:
    """The JSON's ``config``: what TRL made of the arguments (``a``: the trainer's ``GRPOConfig``)."""
    vllm = a.use_vllm
    return {
        "per_device_train_batch_size": a.per_device_train_batch_size,
        "gradient_accumulation_steps": a.gradient_accumulation_steps,
        "generation_batch_size": a.generation_batch_size, "steps_per_generation": a.steps_per_generation,
        "num_generations": a.num_generations, "num_iterations": a.num_iterations,
        "max_completion_length": a.max_completion_length, "beta": a.beta, "loss_type": a.loss_type,
        "bf16": a.bf16, "gradient_checkpointing": a.gradient_checkpointing,
        "model_dtype": model_dtype, "ref_model": ref_model,
        "use_vllm": vllm, "vllm_mode": a.vllm_mode if vllm else None,
        "vllm_gpu_memory_utilization": a.vllm_gpu_memory_utilization if vllm else None,
        "vllm_enable_sleep_mode": a.vllm_enable_sleep_mode if vllm else None,
        "vllm_importance_sampling_correction": a.vllm_importance_sampling_correction if vllm else None,
        "generation_kwargs": a.generation_kwargs, "temperature": a.temperature, "top_p": a.top_p,
        "max_steps": a.max_steps, "warmup_steps": args.warmup, "timed_steps_asked": timed_steps,
        "mapping": (f"one optimizer step = gradient_accumulation_steps {a.gradient_accumulation_steps} x "
                    f"per_device_train_batch_size {a.per_device_train_batch_size} = {args.prompts * args.n} "
                    f"completions = {args.prompts} prompts x num_generations {a.num_generations}; "
                    f"generation_batch_size {a.generation_batch_size} = all of them generated at once "
                    f"(steps_per_generation {a.steps_per_generation})"),
    }


# ----------------------------------------------------------------------------- one mode's JSON

def step_record(global_step: int, secs: float, blocks: List[Tuple[str, float]], completion_tokens: int,
                prompt_tokens: int) -> Dict[str, Any]:
    """One optimizer step's record from its ``secs`` and TRL's profiling ``blocks`` (name, seconds) within it:
    generation, weight sync, ``_prepare_inputs`` (their sum with scoring), the update and tokens/s."""
    totals: Dict[str, float] = {}
    calls: Dict[str, int] = {}
    for name, d in blocks:
        totals[name] = totals.get(name, 0.0) + d
        calls[name] = calls.get(name, 0) + 1
    gen_s = totals.get("vLLM.generate", 0.0) + totals.get("transformers.generate", 0.0)
    prep_s = totals.get("_prepare_inputs", 0.0)
    sync_s = totals.get("sync_weights", 0.0)
    return {"global_step": global_step, "seconds": secs, "generate_s": gen_s, "sync_weights_s": sync_s,
            "prepare_inputs_s": prep_s, "score_s": prep_s - gen_s - sync_s,
            "update_s": secs - prep_s, "compute_loss_fwd_s": totals.get("compute_loss", 0.0),
            "profiling_blocks_s": totals, "profiling_block_calls": calls,
            "completion_tokens": completion_tokens, "prompt_tokens": prompt_tokens,
            "step_completion_tokens_per_s": completion_tokens / secs,
            "step_total_tokens_per_s": (completion_tokens + prompt_tokens) / secs,
            "generate_tokens_per_s": completion_tokens / gen_s if gen_s else None}


def mean_of(steps: List[Dict[str, Any]], on_gpu: bool) -> Dict[str, Any]:
    """The timed steps' mean of each time and rate; generate tokens/s over the summed generation; on a GPU the
    largest peak memory."""
    mean: Dict[str, Any] = {k: sum(r[k] for r in steps) / len(steps) for k in MEAN_KEYS}
    gen = sum(r["generate_s"] for r in steps)
    mean["generate_tokens_per_s"] = (sum(r["completion_tokens"] for r in steps) / gen) if gen else None
    if on_gpu:
        mean["peak_allocated_gib"] = max(r["memory_gib"]["peak_allocated"] for r in steps)
        mean["peak_device_used_gib"] = max(r["memory_gib"]["peak_device_used_sampled"] for r in steps)
    return mean


def merge_mode(out: Path, mode: str, data: Dict[str, Any]) -> None:
    """Read-modify-write of ``out``: ``modes[mode] = data`` (the parent and its children write in turn)."""
    result = json.loads(out.read_text()) if out.exists() else {}
    result.setdefault("modes", {})[mode] = data
    write(out, result)


class ModeRecord:
    """One mode's ``modes[mode]`` in the JSON at ``out``: ``data`` is written (with ``wall_s`` since the start) at
    each ``flush``, after every step and log line, so a run cut short keeps its finished steps."""

    def __init__(self, out: Path, mode: str) -> None:
        self.out, self.mode = out, mode
        self.data: Dict[str, Any] = {"status": "running", "steps": [], "warmup_steps": [], "logs": []}
        self.t_start = time.perf_counter()

    def flush(self) -> None:
        self.data["wall_s"] = time.perf_counter() - self.t_start
        merge_mode(self.out, self.mode, self.data)

    def add_step(self, rec: Dict[str, Any], timed: bool, on_gpu: bool) -> None:
        """A step's record among the timed or the warm-up steps; the timed steps' ``mean`` renewed; written."""
        (self.data["steps"] if timed else self.data["warmup_steps"]).append(rec)
        if self.data["steps"]:
            self.data["mean"] = mean_of(self.data["steps"], on_gpu)
        self.flush()

    def add_log(self, global_step: int, logs: Dict[str, Any]) -> None:
        """TRL's numeric log values of a step; written."""
        self.data["logs"].append({"global_step": global_step,
                                  **{k: v for k, v in logs.items() if isinstance(v, (int, float))}})
        self.flush()


# ----------------------------------------------------------------------------- the parent

def parse_args(description: str) -> argparse.Namespace:
    """The script's command line (``--child`` / ``--child-deadline``: the parent's call of one mode)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trl-site", default=None, help="folder of the carried wheels' install (after site-packages)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8, help="num_generations")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--response-len", type=int, default=1024)
    p.add_argument("--length-dist", choices=["fixed", "longtail"], default="fixed",
                   help="response lengths: all --response-len, or long-tailed up to it (reasonrl/bench/lengths.py)")
    p.add_argument("--length-median", type=int, default=400, help="median of --length-dist longtail")
    p.add_argument("--micro-batch", type=int, default=8, help="per_device_train_batch_size (rows; ours: 8)")
    p.add_argument("--is-correction", type=lambda s: s.lower() == "true", default=True,
                   help="vllm_importance_sampling_correction (TRL's default true: an extra old-log-prob pass; false: "
                        "generate, reference and update only, the passes of gpu_grpo_step.py)")
    p.add_argument("--beta", type=float, default=0.001, help="KL coefficient (> 0: TRL runs a reference model)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=2, help="timed steps in colocate mode")
    p.add_argument("--generate-steps", type=int, default=1, help="timed steps in plain-generate mode")
    p.add_argument("--generate-warmup", type=int, default=None, help="generate mode warm-up steps (default: --warmup)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--sleep-mode", type=lambda s: s.lower() == "true", default=True, help="vLLM sleep mode (GPU)")
    p.add_argument("--kv-cache-gb", type=float, default=1.0, help="vLLM KV cache on CPU (smoke test only)")
    p.add_argument("--deadline-s", type=float, default=480.0, help="wall-clock budget of the whole run")
    p.add_argument("--model-dir", type=Path, default=Path("/tmp/reasonrl-bench-model"))
    p.add_argument("--out", type=Path, default=RESULTS / "gpu_trl_anchor.json")
    p.add_argument("--child", choices=MODES, default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-deadline", type=float, default=None, help=argparse.SUPPRESS)
    return p.parse_args()



def run_children(cmd: List[str], modes: Iterable[str], out: Path, result: Dict[str, Any],
                 deadline: float) -> Dict[str, Any]:
    """Each mode in a child process of its own (``cmd + ["--child", mode, "--child-deadline", ...]``, a session of its
    own): skipped with under 30 s left, its process group killed at ``deadline`` (``time.time()``). After each, the
    parent's ``result`` fields and ``child_exit`` are merged into ``out`` and a mode still ``running`` is marked cut
    short. Returns each mode's exit code or what became of it."""
    rcs: Dict[str, Any] = {}
    for mode in modes:
        left = deadline - time.time()
        if left < 30:
            rcs[mode] = "skipped: no time left"
            print(f"[{mode}] skipped: {left:.0f} s left", flush=True)
            continue
        print(f"[{mode}] child starts, {left:.0f} s left", flush=True)
        proc = subprocess.Popen(cmd + ["--child", mode, "--child-deadline", str(deadline - 5)],
                                start_new_session=True)
        try:
            rc: Any = proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group (vLLM helpers included)
            proc.wait()
            rc = "killed at the deadline"
        rcs[mode] = rc
        merged = json.loads(out.read_text())
        merged.update({k: v for k, v in result.items() if k != "modes"})
        merged["child_exit"] = rcs
        mode_data = merged.setdefault("modes", {}).setdefault(mode, {"status": "no output"})
        if mode_data.get("status") == "running":
            mode_data["status"] = f"cut short ({rc})"
        write(out, merged)
        gc.collect()
    return rcs


def finish(out: Path, modes: List[str], rcs: Dict[str, Any], wall_s: float) -> Dict[str, Any]:
    """The JSON's final ``status`` (ok: every mode ok; partial: some), ``summary`` (each mode's mean) and
    ``wall_s``, written; returned."""
    merged = json.loads(out.read_text())
    merged["child_exit"] = rcs
    merged["wall_s"] = wall_s
    ok = [m for m in modes if merged.get("modes", {}).get(m, {}).get("status") == "ok"]
    merged["status"] = "ok" if len(ok) == len(modes) else ("partial" if ok else "failed")
    merged["summary"] = {m: merged.get("modes", {}).get(m, {}).get("mean") for m in modes}
    write(out, merged)
    return merged
