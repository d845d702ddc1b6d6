"""Our step against a peer's, from two benchmark JSONs of one lease: the median seconds per timed step of each, their
spread, and the ratio of the medians (ours / peer: below 1 is faster). ``benchmarks/gpu_vs_trl.py`` writes the
ratios of ``gpu_grpo_step.py`` against ``gpu_trl_anchor.py``; a ratio is only recorded when both runs name the same
machine and have at least ``MIN_TIMED_STEPS`` timed steps each (a figure from two machines is not a ratio)."""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional

MIN_TIMED_STEPS = 3


def spread(seconds: List[float]) -> Dict[str, Any]:
    """Median, min, max and count of per-step seconds."""
    if not seconds:
        raise ValueError("no timed steps")
    return {"median_s": statistics.median(seconds), "min_s": min(seconds), "max_s": max(seconds),
            "steps": len(seconds)}


def ours_step_seconds(result: Dict[str, Any]) -> List[float]:
    """The timed steps' seconds of a ``gpu_grpo_step.py`` JSON (``steps[i].seconds.step``)."""
    return [float(s["seconds"]["step"]) for s in result.get("steps", [])]


def trl_step_seconds(result: Dict[str, Any], mode: str = "colocate") -> List[float]:
    """The timed steps' seconds of a ``gpu_trl_anchor.py`` JSON (``modes[mode].steps[i].seconds``)."""
    return [float(s["seconds"]) for s in result.get("modes", {}).get(mode, {}).get("steps", [])]


def machine_of(result: Dict[str, Any]) -> Optional[str]:
    """The GPU a benchmark ran on, as the JSON names it (ours: ``machine.gpu``; TRL's: ``modes.*.gpu``)."""
    gpu = (result.get("machine") or {}).get("gpu")
    if gpu:
        return gpu
    for mode in (result.get("modes") or {}).values():
        if mode.get("gpu"):
            return mode["gpu"]
    return None


def step_ratio(ours: List[float], peer: List[float]) -> Dict[str, Any]:
    """``{"ratio": median(ours) / median(peer), "ours": spread, "peer": spread, "ratio_range": [lo, hi]}``, where the
    range pairs our fastest with the peer's slowest step and the reverse. Fewer than ``MIN_TIMED_STEPS`` timed steps
    on either side gives ``{"ratio": None, "why": ...}``."""
    short = [name for name, s in (("ours", ours), ("peer", peer)) if len(s) < MIN_TIMED_STEPS]
    if short:
        return {"ratio": None, "why": f"fewer than {MIN_TIMED_STEPS} timed steps: " + ", ".join(
            f"{name} {len(s)}" for name, s in (("ours", ours), ("peer", peer)) if name in short)}
    a, b = spread(ours), spread(peer)
    return {"ratio": a["median_s"] / b["median_s"], "ratio_range": [a["min_s"] / b["max_s"], a["max_s"] / b["min_s"]],
            "ours": a, "peer": b}
