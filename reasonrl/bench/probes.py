"""What ``benchmarks/gpu_grpo_step.py`` adds to the real training step, without changing it: read-only probes on the actor
worker, and per-phase memory read around the worker group's calls.

* ``BenchWorker`` is ``ActorRolloutRefWorker`` plus ``bench_*`` methods (device memory, the weight-sync check, a
  perturbation of the actor, the same engine's bare ``LLM.generate`` as the in-process vLLM anchor, a profile of one
  micro-batch, per-sample response lengths). The trainer gets it through its backend (``RayBackend(actor_worker=...)``
  or ``InProcessBackend(actor_worker=...)``), so every step is ``Trainer.train_step`` itself.
* ``MemoryProbedGroup`` wraps the actor group the backend started: around each of the calls a step makes
  (``generate``, ``compute_log_probs``, ``compute_ref_log_probs``, ``sleep_engine``, ``update_actor``,
  ``sync_weights``) it resets torch's peak counter on every rank and reads the memory after, under the name of the
  step's phase. Everything else passes through untouched. On a CPU it records nothing (there is no device memory).
"""
from __future__ import annotations

import time
from typing import Any, Dict, List

import torch

from reasonrl.data import Batch
from reasonrl.models.forward import response_log_probs
from reasonrl.rollout import SLEEP_PARTS
from reasonrl.trainer.backends import Groups
from reasonrl.workers.actor_rollout_ref import ActorRolloutRefWorker
from reasonrl.workers.dispatch import ONE_TO_ALL, RANK_ZERO, SPLIT_BY_ENGINE, dispatch

GIB = float(1 << 30)

PHASE_OF_CALL = {"generate": "rollout", "compute_log_probs": "old_log_probs",
                 "compute_ref_log_probs": "ref_log_probs", "sleep_engine": "sleep", "update_actor": "update_actor",
                 "sync_weights": "weight_sync", "wake_engine": "wake"}
"""The actor group's calls a step makes -> the ``timing_s/<phase>`` they run in (``reasonrl/trainer/trainer.py``)."""


def _host_memory_gib() -> Dict[str, float]:
    """This process's resident host memory now and at its peak, from /proc/self/status (kB lines)."""
    out: Dict[str, float] = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out["host_rss_gib" if key == "VmRSS" else "host_peak_rss_gib"] = int(value.split()[0]) * 1024 / GIB
    return out


def device_memory_gib() -> Dict[str, float]:
    """GiB: the device's used and total memory as this process sees it, and this process's torch allocator:
    allocated and reserved now, allocated at its peak (since the last ``torch.cuda.reset_peak_memory_stats``)."""
    free, total = torch.cuda.mem_get_info()
    return {"allocated_gib": torch.cuda.memory_allocated() / GIB,
            "peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
            "reserved_gib": torch.cuda.memory_reserved() / GIB,
            "device_used_gib": (total - free) / GIB, "device_total_gib": total / GIB}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class BenchWorker(ActorRolloutRefWorker):
    """ActorRolloutRefWorker plus read-only probes (see the module docstring)."""

    @dispatch(ONE_TO_ALL)
    def bench_memory(self, reset_peak: bool = False) -> Dict[str, float]:
        """GiB: torch's allocated / peak allocated / reserved in this process, the device's used memory, and this
        process's host memory now and at its peak (``VmRSS``/``VmHWM``: pinned offload buffers count) (empty on a
        CPU); with the caching allocator's counts since the process started: ``alloc_retries`` (an allocation that
        failed, emptied the cache and tried again: the cost of memory pressure) and ``ooms``. ``reset_peak``: start a
        new peak afterwards."""
        if self.device != "cuda":
            return {}
        _sync()
        out = {**device_memory_gib(), **_host_memory_gib()}
        stats = torch.cuda.memory_stats()
        out["alloc_retries"] = float(stats.get("num_alloc_retries", 0))
        out["ooms"] = float(stats.get("num_ooms", 0))
        if reset_peak:
            torch.cuda.reset_peak_memory_stats()
        return out

    @dispatch(ONE_TO_ALL)
    def bench_wake(self) -> float:
        """Seconds to wake the engine (weights + KV cache), with a device synchronise."""
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
        engine_lp = torch.tensor(self.host.engine.sequence_logprobs([list(prompt_ids)], [list(response_ids)])[0])
        ids = torch.tensor([list(prompt_ids) + list(response_ids)], device=self.device)
        pos = torch.arange(ids.shape[1], device=self.device)[None]
        self.policy.model.eval()
        actor_lp, _ = response_log_probs(self.policy.model, ids, torch.ones_like(ids), pos,
                                         torch.tensor([list(response_ids)], device=self.device))
        diff = (actor_lp[0].float().cpu() - engine_lp.float()).abs()
        return {"max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
                "tokens": int(diff.numel()), "actor_mean_logprob": float(actor_lp.float().mean())}

    @dispatch(ONE_TO_ALL)
    @torch.no_grad()
    def bench_perturb(self, scale: float, seed: int = 123) -> int:
        """Add N(0, scale^2) noise to every *trained* actor parameter (so a stale engine is visibly stale). Only the
        parameters the optimizer moves: with LoRA the base weights are frozen and adapter-only sync never sends them,
        so perturbing them would make any engine look stale (the check would fail however right the sync is). The
        noise is drawn on the worker's device and added where each shard lives (host memory when
        ``actor.offload_params`` has offloaded it: the eleventh session's 7B run failed here with a CUDA generator)."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        count = 0
        for p in self.policy.model.parameters():
            if not p.requires_grad:
                continue
            local = p.to_local() if hasattr(p, "to_local") else p
            noise = torch.randn(local.shape, generator=gen, device=self.device, dtype=local.dtype) * scale
            local.add_(noise.to(local.device))
            count += 1
        return count

    @dispatch(ONE_TO_ALL)
    def bench_set_lengths(self, lengths: List[int]) -> int:
        """Give each sample of a vLLM generate call that ignores EOS its own ``max_tokens``
        (``reasonrl.bench.lengths.with_per_sample_lengths`` on this worker's ``LLM`` instance). ``lengths`` are the whole
        batch's, in sample order; each engine takes the slice of the prompts it is given (split by engine, as
        ``generate`` splits them). Returns the count this rank took."""
        if self.host is None or not hasattr(self.host.engine, "llm"):
            raise ValueError("per-sample response lengths need the vLLM engine (rollout.engine=vllm)")
        from reasonrl.bench.lengths import with_per_sample_lengths

        tp = self.cfg.rollout.tensor_parallel_size
        share = len(lengths) // (self.world_size // tp)
        mine = lengths[(self.rank // tp) * share:][:share]
        self.host.engine.llm.generate = with_per_sample_lengths(type(self.host.engine.llm).generate.__get__(self.host.engine.llm),
                                                           mine)
        return len(mine)

    @dispatch(ONE_TO_ALL)
    def bench_engine_facts(self) -> Dict[str, Any]:
        """The vLLM engine's memory share, KV-cache size and scheduler limits (``reasonrl.bench.engine_facts.vllm_engine_facts``)."""
        if self.host is None or not hasattr(self.host.engine, "llm"):
            return {"error": "no vLLM engine"}
        from reasonrl.bench.engine_facts import vllm_engine_facts

        return vllm_engine_facts(self.host.engine.llm)

    @dispatch(SPLIT_BY_ENGINE)
    def bench_raw_generate(self, prompts: Batch, n: int, max_tokens: int) -> Batch:
        """The same engine's bare ``LLM.generate`` on its share of the prompts (split by engine, as the rollout is):
        no log-probs, no conversion, no hand-off (the vLLM anchor). One row: seconds, tokens."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        self._wake_engine(SLEEP_PARTS)
        self.host.engine.finish_weight_update()
        params = VSamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, ignore_eos=True)
        _sync()
        start = time.perf_counter()
        outs = self.host.engine.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts["prompt_ids"]],
                                        params, use_tqdm=False)
        _sync()
        seconds = time.perf_counter() - start
        tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
        return Batch(meta={"seconds": [seconds], "tokens": [tokens]})

    @dispatch(RANK_ZERO)
    def bench_profile(self, rows: int, prompt_len: int, response_len: int, vocab: int) -> Dict[str, Any]:
        """torch.profiler over one micro-batch of ``rows`` random sequences (``prompt_len + response_len`` tokens): a
        no-grad log-prob pass, then forward + backward of the summed log-probs (gradients dropped afterwards).
        Returns the top operators by device (or CPU) time."""
        from torch.profiler import ProfilerActivity, profile

        self.sleep_engine()  # as in the update phase: the engine's memory is free
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(1, vocab - 1, (rows, prompt_len + response_len), generator=gen).to(self.device)
        args = (ids, torch.ones_like(ids), torch.arange(ids.shape[1], device=self.device).expand(rows, -1),
                ids[:, prompt_len:])
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device == "cuda" else [])
        sort_key = "self_cuda_time_total" if self.device == "cuda" else "self_cpu_time_total"
        out: Dict[str, Any] = {"rows": rows, "tokens": int(ids.numel())}
        for name, train in (("log_probs_no_grad", False), ("update_fwd_bwd", True)):
            self.policy.model.train(train)
            _sync()
            with profile(activities=activities) as prof:
                start = time.perf_counter()
                if train:
                    lp, _ = response_log_probs(self.policy.model, *args, with_entropy=False)
                    lp.sum().backward()
                else:
                    with torch.no_grad():
                        response_log_probs(self.policy.model, *args, with_entropy=True)
                _sync()
                seconds = time.perf_counter() - start
            self.policy.optimizer.zero_grad(set_to_none=True)
            out[name] = {"seconds": seconds,
                         "top_ops": prof.key_averages().table(sort_by=sort_key, row_limit=30, max_name_column_width=60)}
        self._wake_engine(SLEEP_PARTS)
        return out


class MemoryProbedGroup:
    """The actor group, with each phase's memory read around its call (see the module docstring). ``memory`` holds
    the current step's ``{phase: [per-rank dict]}``, ``response_lengths`` the lengths of every response the step's
    ``generate`` calls returned (a dynamic-sampling refill adds its own); ``take()`` returns the memory and clears
    both. ``last_sample`` is the first response (prompt ids, response ids) of the latest ``generate``."""

    def __init__(self, group: Any, enabled: bool) -> None:
        self._group, self._enabled = group, enabled
        self.memory: Dict[str, List[Dict[str, float]]] = {}
        self.response_lengths: List[int] = []
        self.last_sample: Any = None

    def take(self) -> Dict[str, List[Dict[str, float]]]:
        """This step's memory per phase, per rank; cleared for the next step."""
        out, self.memory, self.response_lengths = self.memory, {}, []
        return out

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        target = getattr(self._group, name)
        if name not in PHASE_OF_CALL:
            return target

        def probed(*args: Any, **kwargs: Any) -> Any:
            if self._enabled:
                self._group.bench_memory(reset_peak=True)
            out = target(*args, **kwargs)
            if self._enabled:
                self.memory[PHASE_OF_CALL[name]] = self._group.bench_memory()
            if name == "generate" and len(out):  # the engines' Samples; the first's prompt from the prompt batch
                self.response_lengths += [len(s.response_ids) for s in out]
                self.last_sample = (list(args[0]["prompt_ids"][out[0].group]), list(out[0].response_ids))
            return out

        return probed


class ProbedBackend:
    """A backend (``RayBackend`` or ``InProcessBackend`` with ``actor_worker=BenchWorker``) whose actor group comes
    back wrapped in a ``MemoryProbedGroup`` (``self.probed`` after ``start``)."""

    def __init__(self, inner: Any, memory: bool) -> None:
        self.inner, self.memory = inner, memory
        self.probed: MemoryProbedGroup = None  # type: ignore[assignment]

    def start(self, cfg, plan, model_path: str, startup) -> Groups:
        """The inner backend's groups, the actor group probed."""
        groups = self.inner.start(cfg, plan, model_path, startup)
        self.probed = MemoryProbedGroup(groups.actor, self.memory)
        groups.actor = self.probed
        return groups
