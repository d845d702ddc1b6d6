"""GRPO steps of the hybrid engine, each one ``Trainer.train_step`` itself, on a random-weight Qwen2.5-shaped model
-> JSON.

    python benchmarks/gpu_grpo_step.py [--shape qwen2.5-1.5b] [--out results/gpu_grpo_step.json]
    python benchmarks/gpu_grpo_step.py --workers 2 --tp 2 --shape 7b --prompts-per-gpu 32 ...
    python benchmarks/gpu_grpo_step.py --shape tiny --engine hf ...    # the CPU dry run (benchmarks/README.md)

The run is the trainer's own: the config comes from ``load_config`` (overrides below plus ``--set``), the plan from
``RunPlan.build``, the workers from ``RayBackend`` (the real placement: one process per GPU, ``--workers N`` ranks,
``--tp T`` ranks per vLLM engine; ``--backend in-process``: the same worker in this process, world size 1) and each
timed step is ``Trainer.train_step()``; nothing of the step is copied here. The model is saved as a HF directory
(``model.path=``), the prompts as a jsonl dataset of exactly ``--prompt-len`` tokens each (``data.train_files=``,
``reasonrl/bench/workload.py``), scored by the ``bench_random`` verifier plugin (a hash of the response: a random-weight
model writes no answers; verification is measured by the CPU benchmarks).

Response lengths: the plan's training sampling gets ``ignore_eos`` (``SamplingParams.ignore_eos``, a field of the
engine seam), so every response runs to ``rollout.max_new_tokens = --response-len``. ``--length-dist longtail``
gives each sample its own ``max_tokens`` from ``reasonrl/bench/lengths.py`` (the same lengths as ``gpu_trl_anchor.py
--length-dist longtail``) by wrapping the worker's own vLLM ``LLM.generate`` (``BenchWorker.bench_set_lengths``);
vLLM only.

Per step the JSON keeps the fields of the earlier script where they mean the same: ``seconds`` per phase (the
step's ``timing_s/*``: rollout, verify, old_log_probs when the plan runs it, ref_log_probs, advantages, sleep,
update_actor, weight_sync, step; the wake is part of weight_sync), tokens/s (rollout, update, per GPU), update MFU (6
x params x tokens/s over 989 TFLOP/s, H200 dense bf16), weight-sync bytes, and per phase, per rank the peak of
torch's allocator and the device memory in use at its end (``reasonrl.bench.probes.MemoryProbedGroup``; GPU only). Then the
same engine's bare ``LLM.generate`` on the same prompts (the in-process vLLM anchor), a profile of one micro-batch,
and two correctness checks: the engine's log-probs of a sampled sequence equal the actor's after a sync (and differ
before it, once the actor has been perturbed), and device memory drops on sleep. The results are written after every
step, so a run cut short still leaves its finished steps.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from reasonrl.bench.records import (RESULTS, exit_with_status, recorded, seconds_since_process_start,  # noqa: E402
                                    write)
from reasonrl.bench.shapes import SHAPE_ALIASES, SHAPES, parameter_count, trainer_model_dir  # noqa: E402
from reasonrl.bench.summary import mean_of, summarize_step  # noqa: E402
from reasonrl.bench.workload import use_bench_reward, write_prompt_dataset  # noqa: E402


def optional_override(key: str, value: str) -> List[str]:
    """``[key=value]``, or nothing for ``auto`` (the config's own default decides)."""
    return [] if value == "auto" else [f"{key}={value}"]


def config_overrides(args, model_dir: Path, data_file: Path, run_dir: Path, on_gpu: bool) -> List[str]:
    """The trainer config of the benchmark (``--set`` last, so it wins)."""
    return [
        f"model.path={model_dir}", f"model.dtype={'bfloat16' if on_gpu else 'float32'}",
        f"model.gradient_checkpointing={args.gradient_checkpointing}",
        f"data.train_files=[{data_file}]", f"data.train_batch_size={args.prompts}",
        f"data.max_prompt_length={args.prompt_len}", "data.apply_chat_template=false", "data.system_prompt=null",
        "reward.verifier=bench_random", f"reward.workers={args.reward_workers}",
        f"rollout.engine={args.engine}", f"rollout.tensor_parallel_size={args.tp}", f"rollout.n={args.n}",
        f"rollout.max_new_tokens={args.response_len}", "rollout.temperature=1.0", "rollout.top_p=1.0",
        "rollout.top_k=-1", *optional_override("rollout.logprobs", args.rollout_logprobs),
        f"rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
        f"rollout.enforce_eager={args.enforce_eager}", "rollout.free_cache_engine=true",
        f"rollout.kv_cache_gb={args.kv_cache_gb}",
        f"actor.micro_batch_size_per_worker={args.micro_batch}", f"actor.ppo_mini_batch_size={args.mini_batch}",
        *optional_override("actor.use_packing", args.packing),
        f"actor.max_tokens_per_micro_batch={args.max_tokens_per_micro_batch}",
        "actor.lr=1e-6", "algorithm=grpo", "algorithm.use_kl_loss=true", "trainer.profile=none",
        "trainer.resume=never", f"trainer.device={'cuda' if on_gpu else 'cpu'}", "trainer.seed=1",
        f"trainer.num_workers={args.workers}", f"trainer.output_dir={run_dir}", "trainer.save_every=0",
        "trainer.val_every=0", "trainer.val_before_train=false", "trainer.logger=[jsonl]",
        f"trainer.total_steps={args.warmup + args.steps}",
        *args.set,
    ]


def benchmark_plan(cfg, args):
    """``RunPlan.build(cfg, hardware)`` with the benchmark's two departures, made on the plan the trainer is handed: the
    training sampling ignores EOS (fixed lengths), and ``--old-log-prob-pass always`` runs that pass."""
    from reasonrl.config.plan import RunPlan
    from reasonrl.hardware import local_hardware

    plan = RunPlan.build(cfg, local_hardware(cfg.trainer.device))
    if plan.is_async or plan.stream_chunk_prompts > 0:
        raise ValueError("the step benchmark measures colocated, unstreamed rollouts: leave trainer.mode=colocated and "
                         "rollout.stream_chunk_prompts=0 (the response lengths are read from the generate call)")
    plan = dataclasses.replace(plan, training_sampling={**plan.training_sampling, "ignore_eos": True})
    if args.old_log_prob_pass == "always":
        plan = dataclasses.replace(plan, passes=dataclasses.replace(plan.passes, old_log_probs=True))
    return plan


def make_backend(args, on_gpu: bool):
    """The trainer's backend with ``BenchWorker`` as the actor worker, its actor group memory-probed."""
    from reasonrl.trainer.backends import InProcessBackend, RayBackend
    from reasonrl.bench.probes import BenchWorker, ProbedBackend

    if args.backend == "in-process":
        if args.workers != 1 or args.tp != 1:
            raise ValueError(f"--backend in-process runs one worker in this process: --workers 1 --tp 1, got "
                             f"--workers {args.workers} --tp {args.tp}")
        inner = InProcessBackend(actor_worker=BenchWorker, num_threads=args.threads)
    else:
        inner = RayBackend(actor_worker=BenchWorker)
    return ProbedBackend(inner, memory=on_gpu)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES) + sorted(SHAPE_ALIASES), default="qwen2.5-1.5b")
    p.add_argument("--workers", type=int, default=1, help="data-parallel ranks, one GPU each (trainer.num_workers)")
    p.add_argument("--tp", type=int, default=1, help="rollout.tensor_parallel_size: ranks per vLLM engine")
    p.add_argument("--prompts", type=int, default=64, help="data.train_batch_size")
    p.add_argument("--prompts-per-gpu", type=int, default=0,
                   help="if set, prompts = this x --workers (same work per GPU at any N); overrides --prompts")
    p.add_argument("--n", type=int, default=8, help="rollout.n")
    p.add_argument("--prompt-len", type=int, default=256, help="tokens of every prompt (data.max_prompt_length)")
    p.add_argument("--response-len", type=int, default=1024, help="rollout.max_new_tokens")
    p.add_argument("--length-dist", choices=["fixed", "longtail"], default="fixed",
                   help="response lengths: all --response-len, or long-tailed up to --response-len (reasonrl/bench/lengths.py)")
    p.add_argument("--length-median", type=int, default=400, help="median of --length-dist longtail")
    p.add_argument("--engine", choices=["vllm", "hf"], default="vllm", help="rollout.engine (hf: CPU dry runs)")
    p.add_argument("--backend", choices=["ray", "in-process"], default="ray",
                   help="RayBackend (one process per GPU) or InProcessBackend (this process, world size 1)")
    p.add_argument("--threads", type=int, default=0, help="in-process backend: torch CPU threads (0: as is)")
    p.add_argument("--reward-workers", type=int, default=1, help="reward.workers (the verifier pool's processes)")
    p.add_argument("--packing", choices=["auto", "true", "false"], default="auto",
                   help="actor.use_packing (auto: the config's default, on with the GPU's varlen attention)")
    p.add_argument("--max-tokens-per-micro-batch", type=int, default=0, help="actor.max_tokens_per_micro_batch")
    p.add_argument("--old-log-prob-pass", choices=["auto", "always"], default="auto",
                   help="auto: when the plan runs it (reasonrl.config.passes); always: forced on the plan")
    p.add_argument("--steps", type=int, default=3, help="timed steps after the warm-up steps")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--micro-batch", type=int, default=8, help="actor.micro_batch_size_per_worker (rows)")
    p.add_argument("--mini-batch", type=int, default=0, help="actor.ppo_mini_batch_size (prompts; 0: whole batch)")
    p.add_argument("--gradient-checkpointing", type=lambda s: s.lower() == "true", default=False)
    p.add_argument("--rollout-logprobs", choices=["auto", "true", "false"], default="auto",
                   help="rollout.logprobs: ask the engine for the sampled tokens' log-probs (auto: the config's "
                        "default, off without an off-policy correction)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="more config overrides, e.g. --set actor.compile=true --set actor.offload_optimizer=true")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--enforce-eager", type=lambda s: s.lower() == "true", default=False)
    p.add_argument("--kv-cache-gb", type=float, default=1.0, help="vLLM KV cache on CPU (smoke test only)")
    p.add_argument("--deadline-s", type=float, default=1e9,
                   help="start no timed step (beyond the first) that would end later than this after start-up")
    p.add_argument("--reserve-s", type=float, default=60.0, help="seconds kept for the anchor and the checks")
    p.add_argument("--check-tokens", type=int, default=256, help="response tokens in the weight-sync check")
    p.add_argument("--anchor", type=lambda s: s.lower() == "true", default=True,
                   help="after the steps, the bare LLM.generate anchor and the micro-batch profile (false: only the "
                        "weight-sync and sleep checks, to save device time)")
    p.add_argument("--model-dir", type=Path, default=Path("/tmp/reasonrl-bench-model"))
    p.add_argument("--out", type=Path, default=RESULTS / "gpu_grpo_step.json")
    args = p.parse_args(argv)
    args.shape = SHAPE_ALIASES.get(args.shape, args.shape)
    if args.prompts_per_gpu:
        args.prompts = args.prompts_per_gpu * args.workers
    if args.length_dist != "fixed" and args.engine != "vllm":
        p.error(f"--length-dist {args.length_dist} needs --engine vllm (the per-sample lengths wrap vLLM's generate)")
    return args


def machine_facts(on_gpu: bool) -> Dict[str, Any]:
    facts = {"platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__,
             "gpu": torch.cuda.get_device_name(0) if on_gpu else None, "cpus": os.cpu_count()}
    try:
        import vllm

        facts["vllm"] = vllm.__version__
    except Exception as exc:  # recorded; the worker fails clearly if the engine is needed and missing
        facts["vllm"] = f"import failed: {exc!r}"
    return facts


def main(argv=None) -> None:
    args = parse_args(argv)
    use_bench_reward()  # before anything reads the verifier registry
    on_gpu = torch.cuda.is_available()
    wall_start = time.perf_counter()
    result: Dict[str, Any] = {
        "benchmark": "gpu_grpo_step", "status": "running", "args": {k: str(v) for k, v in vars(args).items()},
        "machine": machine_facts(on_gpu), "params": parameter_count(args.shape),
        "notes": ["each step is Trainer.train_step (RunPlan.build + the backend's workers); seconds are its "
                  "timing_s/* (measured at the controller, Ray hand-off included); wake is inside weight_sync",
                  "peak_allocated_gib is torch's allocator peak in the worker; it counts vLLM's sleep-mode pool "
                  "(cumem) even while that memory is unmapped, so during sleep/update it overstates physical use by "
                  "about checks.memory.freed_by_sleep_gib; device_used_gib (cudaMemGetInfo) is physical.",
                  "verify scores with the bench_random plugin (a hash of the response)."],
        "targets": {"rollout_vs_vllm": ">= 0.90", "sync_plus_sleep_wake_fraction_of_step": "<= 0.03",
                    "update_mfu": ">= 0.40"},
    }
    with recorded(args.out, result, wall_start), tempfile.TemporaryDirectory(prefix="gpu-grpo-step-") as tmp:
        trainer = run_steps(args, result, on_gpu, wall_start, Path(tmp))
        try:
            after_steps(trainer, args, result, on_gpu, wall_start)
        finally:
            trainer.close()
    summary = {k: result.get(k) for k in ("mean", "vllm_same_engine_bare_generate", "rollout_vs_bare_vllm",
                                          "checks", "setup_s", "memory_after_init_gib_per_rank")}
    print("SUMMARY " + json.dumps(summary, default=str), flush=True)
    print(f"wrote {args.out} ({result['status']})", flush=True)
    exit_with_status(result)


def run_steps(args, result: Dict[str, Any], on_gpu: bool, wall_start: float, tmp: Path):
    """Build the trainer as ``reasonrl.train`` does (config, plan, backend) and run the warm-up and timed steps;
    returns the trainer (its workers still up)."""
    from reasonrl.config import load_config
    from reasonrl.config.worker_plan import adamw_impl
    from reasonrl.trainer.trainer import Trainer

    t0 = time.perf_counter()
    model_dir = trainer_model_dir(args.shape, args.model_dir)
    data_file = write_prompt_dataset(tmp / "prompts.jsonl", args.prompts, args.prompt_len, seed=0)
    result["setup_s"] = {"write_model": time.perf_counter() - t0}
    cfg, _ = load_config(config_overrides(args, model_dir, data_file, tmp / "run", on_gpu), cuda_available=on_gpu)
    plan = benchmark_plan(cfg, args)
    result["old_log_prob_pass"] = plan.passes.old_log_probs
    result["engine_sleep_level"] = plan.engine_sleep_level
    result["ref_param_dtype"] = cfg.ref.param_dtype  # auto: the compute dtype on the GPU (workers/policy.py)
    result["adamw_impl"] = adamw_impl(cfg, "cuda")  # what the actor's AdamW ran as (config/worker_plan.py)
    backend = make_backend(args, on_gpu)
    t0 = time.perf_counter()
    trainer = Trainer(cfg, plan, backend)
    result["setup_s"]["trainer_init"] = time.perf_counter() - t0
    result["setup_s"].update(trainer.startup.seconds)
    result["workers"] = trainer.worker_info
    lengths = sorted({len(p.token_ids) for p in trainer.train_data.prompts})
    if lengths != [args.prompt_len]:
        raise RuntimeError(f"the trainer's prompts have {lengths} tokens, not --prompt-len {args.prompt_len}")
    result["memory_after_init_gib_per_rank"] = trainer.workers.bench_memory()
    write(args.out, result)
    print(f"{args.workers} worker(s) up in {result['setup_s']['trainer_init']:.1f} s: {result['workers']}", flush=True)
    if args.engine == "vllm":  # the engine's memory share and KV-cache room, for setting it beside TRL's
        result["engine"] = trainer.workers.bench_engine_facts()
        print(f"engine: {json.dumps(result['engine'])}", flush=True)
    if args.length_dist != "fixed":
        from reasonrl.bench.lengths import response_lengths

        drawn = response_lengths(args.length_dist, args.prompts * args.n, args.response_len, args.length_median, 0)
        trainer.workers.bench_set_lengths(drawn)
        result["response_lengths"] = {"dist": args.length_dist, "sum": sum(drawn), "max": max(drawn),
                                      "median": sorted(drawn)[len(drawn) // 2]}
    steps: List[Dict[str, Any]] = []
    warmups: List[Dict[str, Any]] = []
    for i in range(args.warmup + args.steps):
        last = (steps or warmups)[-1]["seconds"]["step"] if (steps or warmups) else 0.0
        if i > args.warmup and time.perf_counter() - wall_start + 1.2 * last + args.reserve_s > args.deadline_s:
            result["stopped_early"] = f"{len(steps)} timed steps: the next would pass --deadline-s"
            print(result["stopped_early"], flush=True)
            break
        metrics = trainer.train_step()
        trainer.step += 1  # as Trainer.fit does after each step
        summary = summarize_step(metrics, backend.probed, result["params"], args.workers, args.prompt_len)
        (warmups if i < args.warmup else steps).append(summary)
        if i == 0:  # launch to the end of the first step: the process's start, imports and engine start included
            result["launch_to_first_step_s"] = seconds_since_process_start()
        print(f"step {i} ({'warm-up' if i < args.warmup else 'timed'}): "
              + ", ".join(f"{k} {v:.2f}s" for k, v in summary["seconds"].items())
              + f"; rollout {summary['rollout_tokens_per_s']:.0f} tok/s, update MFU {summary['update_mfu']:.3g}"
              + f", {summary['step_response_tokens_per_s_per_gpu']:.0f} response tok/s per GPU", flush=True)
        result["warmup_steps"], result["steps"] = warmups, steps
        if steps:
            result["mean"] = mean_of(steps)
        write(args.out, result)
    return trainer


def after_steps(trainer, args, result: Dict[str, Any], on_gpu: bool, wall_start: float) -> None:
    """The in-process vLLM anchor and a profile of one micro-batch (``--anchor``), then the correctness checks
    (vLLM only)."""
    group = trainer.workers
    sample = group.last_sample  # the first response of the last step (reasonrl.bench.probes.MemoryProbedGroup)
    if args.engine != "vllm":
        result["checks"] = {"skipped": "the anchor and the weight-sync checks need the vLLM engine"}
        return
    if args.anchor:
        anchor_and_profile(trainer, args, result, wall_start)
    result["checks"] = weight_sync_checks(group, sample[0], sample[1][:args.check_tokens], on_gpu)
    print(f"checks: {json.dumps(result['checks'])}", flush=True)


def anchor_and_profile(trainer, args, result: Dict[str, Any], wall_start: float) -> None:
    """The same engine's bare ``LLM.generate`` on the step's prompts, and a profile of one micro-batch when the
    deadline leaves room."""
    from reasonrl.data import Batch

    group = trainer.workers
    prompts = [p.token_ids for p in trainer.train_data.prompts]  # the step's own prompts
    parts = group.bench_raw_generate(Batch(meta={"prompt_ids": prompts}), args.n, args.response_len)
    seconds, tokens = max(parts["seconds"]), sum(parts["tokens"])  # the engines run side by side
    raw = {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}
    result["vllm_same_engine_bare_generate"] = raw
    if result.get("steps"):
        result["rollout_vs_bare_vllm"] = result["mean"]["rollout_tokens_per_s"] / raw["tokens_per_s"]
    print(f"bare vLLM generate on the same engine: {raw}", flush=True)
    write(args.out, result)
    if time.perf_counter() - wall_start + 30 < args.deadline_s:  # what bounds the update
        vocab = int(SHAPES[args.shape]["vocab_size"])
        prof = group.bench_profile(min(args.micro_batch, args.prompts * args.n), args.prompt_len, args.response_len,
                                   vocab)
        result["profile"] = prof
        for name in ("log_probs_no_grad", "update_fwd_bwd"):
            print(f"profile {name} ({prof[name]['seconds']:.2f} s for {prof['tokens']} tokens):\n"
                  + prof[name]["top_ops"][:3000], flush=True)
        write(args.out, result)


def weight_sync_checks(group, prompt_ids: List[int], response_ids: List[int], on_gpu: bool) -> Dict[str, Any]:
    """Engine == actor after a sync, != once the actor is perturbed, == again after a resync; memory drops on
    sleep (GPU)."""
    checks: Dict[str, Any] = {"after_last_sync": group.bench_sync_check(prompt_ids, response_ids)}
    group.bench_perturb(0.02)
    checks["stale_after_perturbing_actor"] = group.bench_sync_check(prompt_ids, response_ids)
    t0 = time.perf_counter()
    group.sync_weights()
    checks["resync_s"] = time.perf_counter() - t0
    checks["after_resync"] = group.bench_sync_check(prompt_ids, response_ids)
    if on_gpu:
        before = group.bench_memory()[0]["device_used_gib"]
        group.bench_sleep()
        asleep = group.bench_memory()[0]["device_used_gib"]
        group.bench_wake()
        awake = group.bench_memory()[0]["device_used_gib"]
        group.sync_weights()  # a level-2 sleep discarded the engine's weights: refill them (harmless at level 1)
        checks["memory"] = {"device_used_awake_gib": before, "device_used_asleep_gib": asleep,
                            "device_used_after_wake_gib": awake, "freed_by_sleep_gib": before - asleep}
        checks["memory_returns_after_sleep"] = before - asleep > 1.0
    stale = checks["stale_after_perturbing_actor"]["mean_abs_diff"]
    synced = checks["after_resync"]["mean_abs_diff"]
    # bf16 engine vs bf16-compute actor differ by a floor (~0.02 nats mean on the H200 for this model, the same
    # as the rollout-vs-actor mismatch over a whole batch); a stale engine is >10x further off than a synced one.
    checks["weight_sync_criterion"] = "after_resync mean < 0.1 nats and stale mean > 10 x after_resync mean"
    checks["weight_sync_ok"] = synced < 0.1 and stale > 10 * synced
    return checks


if __name__ == "__main__":
    main()
