"""What ``benchmarks/gpu_async_step.py`` adds to the real training step of both modes it compares (colocated
synchronous, and fully asynchronous on one GPU with ``async_rollout.share_devices``), without changing it.

* ``BenchRolloutWorker`` is ``RolloutWorker`` plus ``bench_set_lengths`` (the per-sample response lengths of
  ``reasonrl/bench/lengths.py`` on the replica's own vLLM ``LLM.generate``, as ``BenchWorker`` does for the colocated
  engine) and ``bench_memory``; the trainer gets it through ``RayBackend(rollout_worker=...)``.
* ``step_record`` turns one ``Trainer.train_step``'s metrics and its wall seconds into the benchmark's record: the
  tokens of the batch it trained (prompt + response: ``perf/tokens_per_s`` x ``timing_s/step``), its response tokens
  (``perf/rollout_tokens_per_s`` x ``timing_s/rollout``), both per wall second, the phases' seconds, and the
  version-lag counters (``admission/lag_tokens/<k>``, ``admission/lag_groups/<k>``, when the run has them),
  ``async/staleness``, the share of the batch partial rollouts carried across a weight load (``partial``:
  ``rollout/partial_*``, when the samples record per-token versions) and the seconds of the publish the step reports
  (``weight_sync/<part>_s``: with continuous generation the previous publish's, which ran beside this step), and the
  update's health (``update``: gradient norm, skipped optimizer steps, policy loss, entropy, importance weights).
* ``summarize`` is the timed steps' median and spread (min, quartiles, max) of the rates and walls, the mean wall and
  the pooled rate (all trained tokens over all step seconds: the figure to compare when steps alternate between
  long and short, where a median falls between two clusters), the version-lag histogram
  of the timed steps (the admission counters are cumulative: last timed step minus the last warm-up step) and the
  staleness of each step counted, the publish's seconds per part; with the actor's memory per step (on a GPU),
  ``actor_alloc_retries``: the caching allocator's retries during the timed steps (cumulative too: last timed step
  minus the last warm-up step).
"""
from __future__ import annotations

import statistics
from collections import Counter
from typing import Any, Dict, List, Optional

import torch

from reasonrl.bench.probes import GIB, device_memory_gib
from reasonrl.workers.dispatch import ONE_TO_ALL, dispatch
from reasonrl.workers.rollout_worker import RolloutWorker

LAG_PREFIXES = ("admission/lag_tokens/", "admission/lag_groups/")
UPDATE_KEYS = ("actor/grad_norm", "actor/skipped_optimizer_steps", "actor/pg_loss", "actor/entropy",
               "offpolicy/is_weight_mean", "offpolicy/is_weight_max", "rollout/logprob_diff_max")
"""The update's health, kept with each step under these names: a line whose updates went non-finite shows it step by
step, and whether the replicas' log-probs (the importance weights' denominators) were finite."""


class BenchRolloutWorker(RolloutWorker):
    """RolloutWorker plus per-sample response lengths and a memory probe (see the module docstring)."""

    START_LENGTHS: Optional[List[int]] = None
    """The lengths its engine takes as it starts, before any call can reach it (``with_start_lengths``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.START_LENGTHS is not None:
            self.use_lengths(self.START_LENGTHS)

    @dispatch(ONE_TO_ALL)
    def bench_set_lengths(self, lengths: List[int]) -> int:
        """``use_lengths`` on every replica, from the driver."""
        return self.use_lengths(lengths)

    def use_lengths(self, lengths: List[int]) -> int:
        """Every generate call of this replica's vLLM engine that ignores EOS gives its j-th sample ``lengths[j]``
        tokens (``with_per_sample_lengths``); a call holding the whole round takes the whole list; the requests
        that ``rollout.partial_mode=in_engine`` adds to the engine itself take them in turn
        (``with_per_sample_added_lengths``). Returns its length."""
        if not hasattr(self.host.engine, "llm"):
            raise ValueError("per-sample response lengths need the vLLM engine (rollout.engine=vllm)")
        from reasonrl.bench.lengths import with_per_sample_added_lengths, with_per_sample_lengths

        llm = self.host.engine.llm
        llm.generate = with_per_sample_lengths(type(llm).generate.__get__(llm), list(lengths))
        engine = llm.llm_engine
        engine.add_request = with_per_sample_added_lengths(type(engine).add_request.__get__(engine), list(lengths))
        return len(lengths)

    @dispatch(ONE_TO_ALL)
    def bench_memory(self, reset_peak: bool = False) -> Dict[str, float]:
        """GiB: the device's used and total memory as this process sees it, and this process's torch allocator:
        allocated, reserved and their peaks since the last ``reset_peak`` (vLLM's weights and KV cache are torch
        tensors, so what the replica holds beyond its budget shows here) (empty on a CPU). It does not synchronise
        the device, so a threaded replica (``rollout.partial``) answers while it generates."""
        if self.device != "cuda":
            return {}
        out = {**device_memory_gib(), "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB}
        if reset_peak:
            torch.cuda.reset_peak_memory_stats()
        return out


def with_start_lengths(lengths: List[int]) -> type:
    """A ``BenchRolloutWorker`` whose engine has ``lengths`` from its start. The fleet's dispatcher sends a replica
    its first call, the first k + 1 batches at once, as the trainer is built, so lengths sent after that
    (``bench_set_lengths``) may arrive behind it: in the thirtieth session one more round trip before them let the
    first call go without them (an inference: the failed call's tokens were not recorded), every response ran to
    the 7,936-token cap (192 groups in one call: about 12.2M tokens), and the watchdog found the replicas with no
    answer for 300 s. A class made here is not found under its module's name, so Ray ships it to the workers by
    value (cloudpickle), the lengths with it; a replica the fleet starts again takes them too."""
    return type("BenchRolloutWorkerWithLengths", (BenchRolloutWorker,), {"START_LENGTHS": list(lengths)})


def warmup_steps(asked: Optional[int], steps_ahead: int) -> int:
    """``asked`` (``--warmup``), else the plan's ``steps_ahead`` + 1 (1 colocated, k + 1 async): the fleet starts the
    first k + 1 batches as the trainer is built, with the engine still cold (before ``with_start_lengths`` a
    threaded replica with partial rollouts took the lengths mid-generation: 311,211 response tokens in such a batch
    against the 278,921 drawn, twenty-second and twenty-third sessions)."""
    return asked if asked is not None else steps_ahead + 1


def batches_to_draw(warmup: int, timed: int, steps_ahead: int) -> int:
    """``trainer.total_steps`` for a run of ``warmup`` + ``timed`` steps: ``steps_ahead`` (k) more, so that the
    continuous fleet, which draws batches up to ``trainer.total_steps``, still generates beside the last k timed
    updates, as it does in any step of a longer run. With exactly ``warmup + timed`` the replica had nothing to
    generate beside the last timed update (k = 1), which then ran alone and faster: 15.41 s against a median of
    19.43 s in the twenty-seventh session's no-partial line. The k batches drawn beyond are never trained."""
    return warmup + timed + steps_ahead


def step_record(metrics: Dict[str, Any], wall_s: float) -> Dict[str, Any]:
    """One step's record (see the module docstring)."""
    timing = {k.split("/", 1)[1]: float(v) for k, v in metrics.items() if k.startswith("timing_s/")}
    trained = float(metrics["perf/tokens_per_s"]) * timing["step"]
    response = float(metrics.get("perf/rollout_tokens_per_s", 0.0)) * timing.get("rollout", 0.0)
    record: Dict[str, Any] = {
        "wall_s": wall_s, "trained_tokens": round(trained), "response_tokens": round(response),
        "trained_tokens_per_s": trained / wall_s, "response_tokens_per_s": response / wall_s, "seconds": timing,
        "lag": {k: float(v) for k, v in metrics.items() if k.startswith(LAG_PREFIXES)},
    }
    if "async/staleness" in metrics:
        record["staleness"] = float(metrics["async/staleness"])
    partial = {k[len("rollout/"):]: float(v) for k, v in metrics.items() if k.startswith("rollout/partial_")}
    if partial:
        record["partial"] = partial
    load = {k[len("fleet/load/"):]: float(v) for k, v in metrics.items() if k.startswith("fleet/load/")}
    if load:  # groups each replica generated (several replicas a GPU: how the dispatcher spread them)
        record["fleet_load"] = load
    update = {k: float(metrics[k]) for k in UPDATE_KEYS if k in metrics}
    if update:
        record["update"] = update
    publish = {k[len("weight_sync/"):-2]: float(v) for k, v in metrics.items()
               if k.startswith("weight_sync/") and k.endswith("_s")}
    if publish:
        record["publish_s"] = publish
    return record


def spread(values: List[float]) -> Dict[str, float]:
    """Median, min, quartiles and max of ``values`` (one or more)."""
    ordered = sorted(values)
    quartiles = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else ordered * 3
    return {"median": statistics.median(ordered), "min": ordered[0], "p25": quartiles[0], "p75": quartiles[2],
            "max": ordered[-1]}


def lag_histogram(timed: List[Dict[str, Any]], before: Optional[Dict[str, Any]]) -> Dict[str, float]:
    """The admission counters' growth over the timed steps: last timed step minus ``before`` (the last warm-up
    step's record; None: from zero). Empty when the run reports none."""
    last = timed[-1]["lag"]
    base = before["lag"] if before else {}
    return {k: v - base.get(k, 0.0) for k, v in sorted(last.items())}


def summarize(timed: List[Dict[str, Any]], before: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The timed steps' summary (see the module docstring)."""
    out = {"steps": len(timed),
           "trained_tokens_per_s": spread([r["trained_tokens_per_s"] for r in timed]),
           "response_tokens_per_s": spread([r["response_tokens_per_s"] for r in timed]),
           "wall_s": spread([r["wall_s"] for r in timed]),
           "wall_s_mean": statistics.fmean(r["wall_s"] for r in timed),
           "trained_tokens_per_s_pooled": sum(r["trained_tokens"] for r in timed) / sum(r["wall_s"] for r in timed),
           "lag_histogram": lag_histogram(timed, before)}
    if timed[-1].get("actor_memory"):
        base = (before or {}).get("actor_memory") or {}
        out["actor_alloc_retries"] = timed[-1]["actor_memory"]["alloc_retries"] - base.get("alloc_retries", 0.0)
    parts = sorted({k for r in timed for k in r.get("publish_s", {})})
    if parts:
        out["publish_s"] = {k: spread([r["publish_s"][k] for r in timed if k in r.get("publish_s", {})])
                            for k in parts}
    staleness = [r["staleness"] for r in timed if "staleness" in r]
    if staleness:
        out["staleness_steps"] = {str(int(k)): n for k, n in sorted(Counter(staleness).items())}
    return out
