"""The run's alarms in one place: each with its figure, the step it refers to and a level (``ok``, ``warn``,
``alarm``). Read from the metrics the trainer logs (``reward/failed*``, ``actor/skipped_optimizer_steps``,
``weight_sync/logprob_diff_*``, ``env/drift_rate``, ``async/staleness``, ``rollout/logprob_diff_*``,
``verify/timeouts``), the sample log (failed samples' reasons per verifier) and the checkpoints (each verified by the
trainer's own ``verify_checkpoint``). Reading only.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from .checkpoints import checkpoint_rows
from .metrics_log import MetricsLog
from .sample_index import SampleIndex


def _series(records: Sequence[Dict[str, Any]], key: str) -> List[Tuple[int, float]]:
    return [(r["step"], float(r[key])) for r in records
            if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]


def alarm(name: str, level: str, figure: str, step: Optional[int], detail: str) -> Dict[str, Any]:
    return {"name": name, "level": level, "figure": figure, "step": step, "detail": detail}


def _total(name: str, records, key: str, detail: str, unit: str = "") -> Optional[Dict[str, Any]]:
    """Sum over the steps; ``alarm`` when any, with the last step that had some."""
    points = _series(records, key)
    if not points:
        return None
    total = sum(v for _, v in points)
    last = max((s for s, v in points if v > 0), default=None)
    return alarm(name, "alarm" if total > 0 else "ok", f"{total:g}{unit}", last, detail)


def _peak(name: str, records, key: str, warn_above: float, detail: str) -> Optional[Dict[str, Any]]:
    """The largest value and its step; ``warn`` above ``warn_above``."""
    points = _series(records, key)
    if not points:
        return None
    step, value = max(points, key=lambda p: p[1])
    return alarm(name, "warn" if value > warn_above else "ok", f"max {value:.3g} (last {points[-1][1]:.3g})", step,
                 detail)


def _weight_sync(records) -> Optional[Dict[str, Any]]:
    points = _series(records, "weight_sync/logprob_diff_max")
    if not points:
        return None
    (first_step, first), (last_step, last) = points[0], points[-1]
    growing = len(points) > 1 and last > 2 * max(first, 1e-6)
    return alarm("weight-sync check (max |engine - actor| log-prob)", "warn" if growing else "ok",
                 f"{last:.3g} at step {last_step} (first {first:.3g} at step {first_step})", last_step,
                 "a gap that grows from step to step means the sync did not land (docs/troubleshooting.md)")


def _failures_by_verifier(records, samples: SampleIndex) -> List[Dict[str, Any]]:
    keys = sorted({k for r in records for k in r if k.startswith("reward/") and k.endswith("/failed")})
    reasons = samples.failure_reasons()
    out = []
    for key in keys:
        verifier = key.split("/")[1]
        row = _total(f"failed rewards: {verifier}", records, key, "responses without a verdict (logged samples' "
                     "reasons: " + (", ".join(f"{r or '?'} x{n}" for r, n in reasons.get(verifier, {}).items())
                                     or "none in the sample log") + ")")
        if row:
            out.append(row)
    return out


def health(metrics: MetricsLog, samples: SampleIndex, run_dir) -> Dict[str, Any]:
    """Every alarm that has data in this run, and the checkpoints with their verification."""
    records = metrics.refresh().records
    samples.refresh()
    rows = [
        _total("failed rewards (all verifiers)", records, "reward/failed_count",
               "responses whose verifier gave no verdict: left out of the loss (reward.max_failed_fraction stops "
               "the run)"),
        *_failures_by_verifier(records, samples),
        _total("skipped optimizer steps", records, "actor/skipped_optimizer_steps",
               "non-finite gradient norm: the optimizer step was skipped (trainer.max_skipped_steps stops the run)"),
        _total("verifier timeouts", records, "verify/timeouts", "calls killed at reward.timeout_s"),
        _total("verifier errors", records, "verify/errors", "crashed verifier calls"),
        _weight_sync(records),
        _peak("boundary drift (env/drift_rate)", records, "env/drift_rate", 0.0,
              "multi-turn tokens that differ from the chat template's rendering at a turn boundary"),
        _peak("staleness (async/staleness)", records, "async/staleness", 1.0,
              "steps between the weights that generated a round and the step training on it"),
        _peak("rollout vs actor log-prob gap (rollout/logprob_diff_max)", records, "rollout/logprob_diff_max", 1.0,
              "engine vs actor log-probs of the same tokens"),
    ]
    unread = [("metrics.jsonl", metrics.skipped + metrics.tail.truncated_tail),
              ("samples.jsonl", samples.skipped + samples.tail.truncated_tail)]
    for name, count in unread:
        if count:
            rows.append(alarm(f"unreadable lines in {name}", "warn", str(count), None,
                              "lines skipped: not a row of this version, or an unfinished last line"))
    last = records[-1]["step"] if records else None
    return {"alarms": [r for r in rows if r is not None], "checkpoints": checkpoint_rows(run_dir), "last_step": last}
