"""Which curves the page draws: each chart names the metric keys it overlays, as regular expressions over the keys
of ``metrics.jsonl`` (the page matches them against every key a run has; a chart no run has a key for is left out).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Tuple


@dataclass(frozen=True)
class Chart:
    """One chart of the Curves panel."""

    id: str
    """Its anchor on the page."""
    title: str
    """Its heading."""
    keys: Tuple[str, ...]
    """Regular expressions (anchored) over metric keys; every matching key is one line per run."""


CHARTS: Tuple[Chart, ...] = (
    Chart("reward", "Reward (mean over verdicts; validation)", (r"reward/mean", r"val/reward_mean")),
    Chart("accuracy", "Accuracy (training; validation)", (r"reward/accuracy", r"val/accuracy")),
    Chart("accuracy_source", "Accuracy per verifier / data source",
          (r"reward/(?!failed)[^/]+/accuracy", r"val/(?!accuracy$)[^/]+/accuracy")),
    Chart("accuracy_level", "Training accuracy per level", (r"levels/train_accuracy/.+",)),
    Chart("kl", "KL (actor || reference), coefficient, PPO KL", (r"actor/kl", r"actor/kl_coef", r"actor/ppo_kl")),
    Chart("entropy", "Policy entropy", (r"actor/entropy",)),
    Chart("length", "Response length (tokens) and clip ratio",
          (r"response_length/mean", r"response_length/max", r"response_length/clip_ratio")),
    Chart("timing", "Phase times (s)", (r"timing_s/.+",)),
    Chart("throughput", "Throughput (tokens/s)", (r"perf/.+",)),
    Chart("failures", "Failures: rewards without a verdict, skipped optimizer steps, verifier timeouts",
          (r"reward/failed_count", r"reward/[^/]+/failed", r"actor/skipped_optimizer_steps", r"verify/timeouts",
           r"verify/errors", r"val/failed")),
    Chart("health", "Weight sync, drift, staleness, log-prob gap",
          (r"weight_sync/logprob_diff_(max|mean)", r"env/drift_rate", r"async/staleness",
           r"rollout/logprob_diff_(max|mean)")),
)

X_AXES = {"step": "step", "samples": "_samples"}
"""The x axes the page offers: the step, or the responses trained on so far (``MetricsLog``'s ``_samples``)."""


def chart_specs() -> List[Dict[str, Any]]:
    """The charts as JSON for the page."""
    return [asdict(c) for c in CHARTS]
