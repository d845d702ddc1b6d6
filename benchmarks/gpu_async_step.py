"""One GPU, two ways: (a) the colocated synchronous loop (generate, then train, the engine asleep during the update)
and (b) fully asynchronous training with a rollout replica on the actor's GPU (``async_rollout.share_devices``: its
engine awake while the actor trains) -> trained tokens per second per step (median and spread) and the version-lag
histogram, as JSON.

    python benchmarks/gpu_async_step.py                                 # the 1.5B shape, long-tailed lengths, on a GPU
    python benchmarks/gpu_async_step.py --set async_rollout.engine_memory_fraction=0.25 --steps 12
    python benchmarks/gpu_async_step.py --shape tiny --engine hf --length-dist fixed \\
        --async-set trainer.mode=async --async-set fleet.enabled=true --async-set async_rollout.share_devices=true
                                                                        # the CPU dry run (benchmarks/README.md)

Each mode is the trainer's own run, as in ``gpu_grpo_step.py``: the config from ``load_config`` (the workload's
overrides, ``--set`` for both modes, then the mode's own: ``--colocated-set``, or ``--async-set`` whose default is
``trainer.mode=async fleet.enabled=true async_rollout.share_devices=true fleet.continuous=true async_rollout.max_staleness=1
rollout.partial=true``; give ``--async-set`` to replace that list), the plan from ``RunPlan.build`` (its training
sampling ignores EOS, so the lengths are the benchmark's), the workers from ``RayBackend`` (``BenchWorker`` for the
colocated engine, ``BenchRolloutWorker`` for the replica: ``reasonrl/bench/async_step.py``), each step
``Trainer.train_step``. The model is the random-weight Qwen2.5 shape of ``reasonrl/bench/shapes.py``, the prompts
``reasonrl/bench/workload.py``'s, the rewards the ``bench_random`` plugin's. ``--length-dist longtail`` (vLLM only):
every sample its own length from ``reasonrl/bench/lengths.py`` (log-normal, median ``--length-median``, sigma
``--length-sigma``, capped at ``--response-len``), the same multiset in both modes, so the async mode's gain is the
long tail's bubble filled. The continuous fleet draws k batches beyond the last timed step
(``reasonrl.bench.async_step.batches_to_draw``), so every timed update has generation beside it.

Per timed step (after ``--warmup``): the wall seconds of ``train_step``, the tokens of the batch it trained (prompt +
response) and its response tokens, each per wall second; the phases' ``timing_s/*``; ``admission/lag_tokens/<k>`` and
``lag_groups/<k>`` when the run reports them, and ``async/staleness``. The summary per mode: median, min,
quartiles and max of the rates, the lag histogram of the timed steps, and the async/colocated ratio of the median
trained tokens per second. On a GPU, each step also records the actor's memory after it (``actor_memory``: peak,
reserved, the device's used memory, and the caching allocator's ``alloc_retries``, whose growth over the timed steps
is the summary's ``actor_alloc_retries``: memory pressure, if any) and every process's memory on the GPU
(``gpu_processes``, from ``nvidia-smi``; at a failed step, ``gpu_processes_at_failure``). The JSON goes to
``benchmarks/results/gpu_async_step.json`` only on a GPU (``--out`` elsewhere; a CPU run writes
``/tmp/gpu_async_step_dry_run.json`` unless told), after every step. ``--mps``: both modes under NVIDIA's MPS daemon
(``reasonrl/bench/mps.py``; the JSON's ``placement``), against the default time-slicing. The runs' own
``async_rollout.mps`` is ``disabled`` unless ``--async-set`` says otherwise (each mode's ``plan.mps``).
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
# is_available through NVML: this process must not initialise CUDA before --mps's daemon is up (a process connects to
# the daemon when CUDA initialises, and one that initialised before it is no client: it would be time-sliced still)
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import torch  # noqa: E402

from reasonrl.bench.lengths import LONGTAIL_SIGMA  # noqa: E402
from reasonrl.bench.mps import gpu_placement, mps_client_env  # noqa: E402
from reasonrl.bench.records import RESULTS, exit_with_status, recorded, write  # noqa: E402
from reasonrl.bench.shapes import SHAPE_ALIASES, SHAPES, parameter_count, trainer_model_dir  # noqa: E402
from reasonrl.bench.workload import use_bench_reward, write_prompt_dataset  # noqa: E402

ASYNC_DEFAULTS = ["trainer.mode=async", "fleet.enabled=true", "async_rollout.share_devices=true",
                  "fleet.continuous=true", "async_rollout.max_staleness=1", "rollout.partial=true"]
"""The same-GPU fully-async mode of issue #48 item 4 (``--async-set`` replaces the list)."""
MODES = ("colocated", "async")


def workload_overrides(args, model_dir: Path, data_file: Path, run_dir: Path, on_gpu: bool,
                       total_steps: int) -> List[str]:
    """Both modes' config: the workload (the same for both), then ``--set``."""
    return [
        f"model.path={model_dir}", f"model.dtype={'bfloat16' if on_gpu else 'float32'}",
        f"data.train_files=[{data_file}]", f"data.train_batch_size={args.prompts}",
        f"data.max_prompt_length={args.prompt_len}", "data.apply_chat_template=false", "data.system_prompt=null",
        "reward.verifier=bench_random", "reward.workers=1", "async_rollout.mps=disabled",  # --mps is the switch
        f"rollout.engine={args.engine}", f"rollout.n={args.n}", f"rollout.max_new_tokens={args.response_len}",
        f"eval.max_new_tokens={args.response_len}", "rollout.temperature=1.0", "rollout.top_p=1.0", "rollout.top_k=-1",
        f"rollout.gpu_memory_utilization={args.gpu_memory_utilization}", f"rollout.kv_cache_gb={args.kv_cache_gb}",
        f"actor.micro_batch_size_per_worker={args.micro_batch}", "actor.lr=1e-6", "algorithm=grpo",
        "algorithm.use_kl_loss=false", "trainer.profile=none", "trainer.resume=never",
        f"trainer.device={'cuda' if on_gpu else 'cpu'}", "trainer.seed=1", "trainer.num_workers=1",
        f"trainer.output_dir={run_dir}", "trainer.save_every=0", "trainer.val_every=0",
        "trainer.val_before_train=false", "trainer.logger=[jsonl]", f"trainer.total_steps={total_steps}",
        *args.set,
    ]


def mode_overrides(args, mode: str) -> List[str]:
    return list(args.colocated_set) if mode == "colocated" else list(args.async_set or ASYNC_DEFAULTS)


def fixed_length_plan(cfg):
    """``RunPlan.build`` with the training sampling ignoring EOS (the benchmark sets the lengths)."""
    from reasonrl.config.plan import RunPlan
    from reasonrl.hardware import local_hardware

    plan = RunPlan.build(cfg, local_hardware(cfg.trainer.device))
    return dataclasses.replace(plan, training_sampling={**plan.training_sampling, "ignore_eos": True})


def run_mode(mode: str, args, result: Dict[str, Any], on_gpu: bool, tmp: Path) -> None:
    """One mode's trainer: warm-up and timed steps, recorded into ``result["modes"][mode]`` (written after each)."""
    import ray

    from reasonrl.bench.async_step import (BenchRolloutWorker, batches_to_draw, step_record, summarize, warmup_steps,
                                           with_start_lengths)
    from reasonrl.bench.probes import BenchWorker
    from reasonrl.config import load_config
    from reasonrl.trainer.backends import RayBackend
    from reasonrl.trainer.trainer import Trainer

    model_dir = trainer_model_dir(args.shape, args.model_dir)
    data_file = write_prompt_dataset(tmp / "prompts.jsonl", args.prompts, args.prompt_len, seed=0)
    mode_set = mode_overrides(args, mode)

    def config_and_plan(total_steps: int):
        cfg, _ = load_config(workload_overrides(args, model_dir, data_file, tmp / mode, on_gpu, total_steps)
                             + mode_set, cuda_available=on_gpu)
        return cfg, fixed_length_plan(cfg)

    entry: Dict[str, Any] = {"overrides": [*args.set, *mode_set]}  # beyond the workload's
    result["modes"][mode] = entry
    cfg, plan = config_and_plan(1 + args.steps)  # the plan's steps ahead do not depend on the run's length
    warmup = warmup_steps(args.warmup, plan.steps_ahead)
    total_steps = batches_to_draw(warmup, args.steps, plan.steps_ahead)
    if total_steps != 1 + args.steps:
        cfg, plan = config_and_plan(total_steps)
    entry["plan"] = {"mode": plan.mode, "world_size": plan.world_size, "rollout_workers": plan.rollout_workers,
                     "share_devices": plan.share_devices, "steps_ahead": plan.steps_ahead,
                     "mps": cfg.async_rollout.mps,  # the run's own MPS choice (the JSON's placement: --mps's)
                     "total_steps": total_steps}  # batches the source may draw: k beyond the last timed step
    drawn = None
    if args.length_dist != "fixed":
        from reasonrl.bench.lengths import response_lengths

        drawn = response_lengths(args.length_dist, args.prompts * args.n, args.response_len, args.length_median,
                                 seed=0, sigma=args.length_sigma)
        entry["response_lengths"] = {"dist": args.length_dist, "sum": sum(drawn), "max": max(drawn),
                                     "median": sorted(drawn)[len(drawn) // 2], "sigma": args.length_sigma}
    # the replicas take the lengths as they start: the fleet sends its first call as the trainer is built
    replica = with_start_lengths(drawn) if drawn is not None and plan.is_async else BenchRolloutWorker
    t0 = time.perf_counter()
    trainer = Trainer(cfg, plan, RayBackend(actor_worker=BenchWorker, rollout_worker=replica))
    try:
        entry["setup_s"] = time.perf_counter() - t0
        groups = {"actor": trainer.workers, **({"replicas": trainer.rollouts} if plan.is_async else {})}
        entry["mps_client_env"] = {role: ray.get([w.__ray_call__.remote(mps_client_env) for w in group.workers])
                                   for role, group in groups.items()}  # each process's CUDA_MPS_* (its MPS limits)
        entry["gpu_memory_utilization"] = trainer.cfg.rollout.gpu_memory_utilization  # the replica's: the fraction
        if drawn is not None and not plan.is_async:  # the colocated engine generates only inside a step
            trainer.workers.bench_set_lengths(drawn)
        records: List[Dict[str, Any]] = []
        for i in range(warmup + args.steps):
            start = time.perf_counter()
            try:
                metrics = trainer.train_step()
            except BaseException:
                if on_gpu:  # who held the GPU when the step failed (a replica's memory is not asked of it: it may hang)
                    entry["gpu_processes_at_failure"] = gpu_processes()
                    write(args.out, result)
                raise
            trainer.step += 1  # as Trainer.fit does after each step
            records.append(step_record(metrics, time.perf_counter() - start))
            if on_gpu:  # the actor's memory after the step, its allocator's retries (memory pressure), every process's
                records[-1]["actor_memory"] = trainer.workers.bench_memory(reset_peak=True)[0]
                records[-1]["gpu_processes"] = gpu_processes()
                if plan.is_async and cfg.rollout.partial:  # a threaded replica answers beside its generation
                    records[-1]["replica_memory"] = trainer.rollouts.bench_memory(reset_peak=True)
            print(f"{mode} step {i} ({'warm-up' if i < warmup else 'timed'}): {records[-1]['wall_s']:.2f} s, "
                  f"{records[-1]['trained_tokens_per_s']:.0f} trained tok/s, update {records[-1].get('update')}, "
                  f"lag {records[-1]['lag']}", flush=True)
            entry["warmup_steps"], entry["steps"] = records[:warmup], records[warmup:]
            if entry["steps"]:
                entry["summary"] = summarize(entry["steps"], records[warmup - 1] if warmup else None)
            write(args.out, result)
        if plan.is_async and on_gpu:
            entry["replica_memory"] = trainer.rollouts.bench_memory()
        if on_gpu:  # every process's memory on the GPU now, this driver's among them (the plan does not count it)
            entry["gpu_processes"] = gpu_processes()
            entry["driver"] = {"pid": os.getpid(), "cuda_initialized": torch.cuda.is_initialized()}
    finally:
        trainer.close()
        ray.shutdown()  # each mode starts its own Ray, sized by its plan


def gpu_processes() -> List[Dict[str, Any]]:
    """``nvidia-smi``'s compute processes: pid and MiB used (empty when it cannot say)."""
    import subprocess

    try:
        listed = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = [line.split(",") for line in listed.splitlines() if line.count(",") == 1]
    return [{"pid": int(pid), "used_mib": float(mib)} for pid, mib in rows if pid.strip().isdigit()]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES) + sorted(SHAPE_ALIASES), default="qwen2.5-1.5b")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated, of: colocated, async")
    p.add_argument("--prompts", type=int, default=64, help="data.train_batch_size")
    p.add_argument("--n", type=int, default=8, help="rollout.n")
    p.add_argument("--prompt-len", type=int, default=256, help="tokens of every prompt (data.max_prompt_length)")
    p.add_argument("--response-len", type=int, default=2048, help="rollout.max_new_tokens (the long tail's cap)")
    p.add_argument("--length-dist", choices=["fixed", "longtail"], default="longtail")
    p.add_argument("--length-median", type=int, default=400, help="median of --length-dist longtail")
    p.add_argument("--length-sigma", type=float, default=LONGTAIL_SIGMA,
                   help="sigma of --length-dist longtail's log-normal (larger: a longer tail)")
    p.add_argument("--engine", choices=["vllm", "hf"], default="vllm", help="rollout.engine (hf: the CPU dry run)")
    p.add_argument("--micro-batch", type=int, default=8, help="actor.micro_batch_size_per_worker (rows)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5, help="the colocated engine's share")
    p.add_argument("--kv-cache-gb", type=float, default=1.0, help="vLLM's KV cache on a CPU (dry runs)")
    p.add_argument("--steps", type=int, default=8, help="timed steps after the warm-up (at least 8 for the record)")
    p.add_argument("--warmup", type=int, default=None,
                   help="warm-up steps (default: 1 colocated, async_rollout.max_staleness + 1 async; warmup_steps)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="overrides for both modes")
    p.add_argument("--colocated-set", action="append", default=[], metavar="KEY=VALUE",
                   help="overrides for the colocated mode only")
    p.add_argument("--async-set", action="append", default=None, metavar="KEY=VALUE",
                   help=f"the async mode's overrides (given: replaces the default {' '.join(ASYNC_DEFAULTS)})")
    p.add_argument("--mps", action="store_true",
                   help="run under NVIDIA's MPS daemon (reasonrl/bench/mps.py): the same-GPU processes side by side "
                        "instead of time-sliced; both modes, so the ratio compares like with like")
    p.add_argument("--model-dir", type=Path, default=Path("/tmp/reasonrl-bench-model"))
    p.add_argument("--out", type=Path, default=None,
                   help="the JSON (default: results/gpu_async_step.json on a GPU, /tmp/gpu_async_step_dry_run.json "
                        "elsewhere)")
    args = p.parse_args(argv)
    args.shape = SHAPE_ALIASES.get(args.shape, args.shape)
    args.modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in args.modes):
        p.error(f"--modes takes {', '.join(MODES)}, got {args.modes}")
    if args.length_dist != "fixed" and args.engine != "vllm":
        p.error(f"--length-dist {args.length_dist} needs --engine vllm (the per-sample lengths wrap vLLM's generate)")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    use_bench_reward()  # before anything reads the verifier registry
    on_gpu = torch.cuda.is_available()
    if args.out is None:
        args.out = RESULTS / "gpu_async_step.json" if on_gpu else Path("/tmp/gpu_async_step_dry_run.json")
    wall_start = time.perf_counter()
    result: Dict[str, Any] = {
        "benchmark": "gpu_async_step", "status": "running", "args": {k: str(v) for k, v in vars(args).items()},
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__,
                    "gpu": None, "cpus": os.cpu_count()},
        "params": parameter_count(args.shape), "modes": {},
        "notes": ["each step is Trainer.train_step; wall_s is measured around it; trained tokens = the batch's "
                  "prompt + response tokens (perf/tokens_per_s x timing_s/step)",
                  "lag_histogram: growth of the cumulative admission/lag_* counters over the timed steps (empty "
                  "when the run has no admission control)"],
    }
    with recorded(args.out, result, wall_start), tempfile.TemporaryDirectory(prefix="gpu-async-step-") as tmp, \
            gpu_placement(args.mps, on_gpu) as placement:
        result["placement"] = placement
        result["machine"]["gpu"] = torch.cuda.get_device_name(0) if on_gpu else None  # CUDA starts here
        for mode in args.modes:
            run_mode(mode, args, result, on_gpu, Path(tmp))
        medians = {m: e["summary"]["trained_tokens_per_s"]["median"] for m, e in result["modes"].items()
                   if "summary" in e}
        if len(medians) == 2:
            result["async_over_colocated"] = medians["async"] / medians["colocated"]
    print("SUMMARY " + json.dumps({m: e.get("summary") for m, e in result["modes"].items()}
                                  | {"async_over_colocated": result.get("async_over_colocated")}, default=str))
    print(f"wrote {args.out} ({result['status']})", flush=True)
    exit_with_status(result)


if __name__ == "__main__":
    main()
