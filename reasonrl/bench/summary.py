"""One ``Trainer.train_step``'s metrics -> the GPU step benchmark's per-step record, and the mean over the timed steps.

The record keeps the fields of the earlier, phase-by-phase ``gpu_grpo_step.py`` where they mean the same, so the
README's older figures compare: ``seconds`` per phase are the step's ``timing_s/*`` (``step`` is the whole step;
``timing_s/{offload,onload}_*``, parts of other phases, go to ``offload_timing_s``); response tokens are the lengths
of the responses generated (``MemoryProbedGroup.response_lengths``), all tokens the step's ``perf/tokens_per_s`` x its
seconds (prompt + response of every row); MFU = 6 x params x update tokens/s (2 x for the no-grad reference pass) per
GPU over the H200's dense bf16 peak. ``memory_gib`` holds per phase one dict per rank (GPU only).
"""
from __future__ import annotations

from typing import Any, Dict, List

from reasonrl.bench.shapes import H200_BF16_DENSE_FLOPS

OFFLOAD_PREFIXES = ("offload_", "onload_")


def summarize_step(metrics: Dict[str, Any], probed, n_params: int, gpus: int, prompt_len: int) -> Dict[str, Any]:
    """The record of one step (see the module docstring). ``probed``: the step's ``MemoryProbedGroup``; tokens/s are
    of the whole group, ``*_per_gpu`` divide by ``gpus``."""
    timing = {k.split("/", 1)[1]: float(v) for k, v in metrics.items() if k.startswith("timing_s/")}
    offload = {k: v for k, v in timing.items() if k.startswith(OFFLOAD_PREFIXES)}
    s = {k: v for k, v in timing.items() if k != "step" and k not in offload}
    step = timing["step"]
    lengths: List[int] = list(probed.response_lengths)
    if not lengths:
        raise RuntimeError("the step generated no responses through the actor group's generate (streamed rollouts, "
                           "rollout.stream_chunk_prompts > 0, and async mode are not measured by this benchmark)")
    response_tokens = float(sum(lengths))
    all_tokens = float(metrics["perf/tokens_per_s"]) * step
    update_tps = all_tokens / s["update_actor"] if s.get("update_actor") else None
    sync_sleep = s.get("weight_sync", 0.0) + s.get("sleep", 0.0) + s.get("wake", 0.0)
    ordered = sorted(lengths)
    return {
        "seconds": {**s, "step": step},
        "gpus": gpus,
        "step_response_tokens_per_s_per_gpu": response_tokens / step / gpus,
        "step_all_tokens_per_s_per_gpu": all_tokens / step / gpus,
        "rollout_tokens_per_s_per_gpu": response_tokens / s["rollout"] / gpus,
        "update_tokens_per_s_per_gpu": update_tps / gpus if update_tps else None,
        "rollout_tokens_per_s": response_tokens / s["rollout"],
        "old_log_probs_tokens_per_s": all_tokens / s["old_log_probs"] if "old_log_probs" in s else None,
        "update_tokens_per_s": update_tps,
        "update_mfu": 6 * n_params * update_tps / gpus / H200_BF16_DENSE_FLOPS if update_tps else None,
        "log_prob_mfu": (2 * n_params * all_tokens / s["ref_log_probs"] / gpus / H200_BF16_DENSE_FLOPS
                         if "ref_log_probs" in s else None),
        "sync_plus_sleep_wake_fraction_of_step": sync_sleep / step,
        "phase_fraction_of_step": {k: v / step for k, v in s.items()},
        "memory_gib": probed.take(),
        "response_tokens": response_tokens, "all_tokens": all_tokens,
        "padded_tokens": float(len(lengths) * (prompt_len + ordered[-1])),  # every prompt is prompt_len tokens
        "response_length_min": ordered[0], "response_length_median": float(ordered[len(ordered) // 2]),
        "response_length_max": ordered[-1],
        "weight_sync_bytes": metrics.get("weight_sync/bytes"), "weight_sync_s": s.get("weight_sync"),
        "rollout_vs_actor_logprob_mean_abs_diff": metrics.get("rollout/logprob_diff_mean"),
        "actor_metrics": {k: float(v) for k, v in metrics.items() if k.startswith("actor/")},
        "offload_timing_s": offload,
        "train_step_metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float))},
    }


def mean_of(steps: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The timed steps' mean of each rate and phase; per phase, per rank the largest memory over the steps."""
    keys = ["rollout_tokens_per_s", "update_tokens_per_s", "update_mfu", "log_prob_mfu",
            "sync_plus_sleep_wake_fraction_of_step", "old_log_probs_tokens_per_s",
            "step_response_tokens_per_s_per_gpu", "step_all_tokens_per_s_per_gpu", "rollout_tokens_per_s_per_gpu",
            "update_tokens_per_s_per_gpu", "weight_sync_bytes", "weight_sync_s"]
    out: Dict[str, Any] = {k: (sum(s[k] for s in steps) / len(steps) if steps[0][k] is not None else None)
                           for k in keys}
    out["gpus"] = steps[0]["gpus"]
    phases = list(steps[0]["seconds"])
    out["seconds"] = {k: sum(s["seconds"].get(k, 0.0) for s in steps) / len(steps) for k in phases}
    measured = sorted({k for s in steps for k in s["memory_gib"]})
    for key, field in (("peak_allocated_gib", "peak_allocated_gib"), ("device_used_gib_at_end", "device_used_gib")):
        per_rank = {k: [max(s["memory_gib"][k][r].get(field, 0.0) for s in steps if k in s["memory_gib"])
                        for r in range(max(len(s["memory_gib"].get(k, [])) for s in steps))] for k in measured}
        out[key + "_per_rank"] = per_rank
        out[key] = {k: max(v, default=0.0) for k, v in per_rank.items()}
    return out
