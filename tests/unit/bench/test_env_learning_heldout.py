"""benchmarks/env_learning.py records the held-out tool-call rate beside the held-out accuracy: per validation in the
JSON (``validation_env``), at the start and the end in the summary, and in what it prints. ``--reuse`` reads a run's
metrics written here (this checks the script's plumbing, not a training run) and keeps the wall time the JSON at
``--out`` recorded for the run that trained."""
from __future__ import annotations

import json
import math

import pytest
from helpers import benchmark_module
from paths import REPO


def env_learning(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # it imports learning_curve beside it
    return benchmark_module("env_learning")


def test_the_held_out_call_rate_is_recorded_summarised_and_printed(tmp_path, monkeypatch, capsys):
    runs = tmp_path / "runs"
    run_dir = runs / "search_examples_grpo_seed4"
    run_dir.mkdir(parents=True)
    rows = [{"step": 0, "val/accuracy": 0.25, "val/env/call_rate": 0.5, "val/env/drift_rate": 0.0,
             "val/env/drift_checked": 4.0},
            {"step": 1, "reward/mean": 0.1, "timing_s/step": 2.0, "env/call_rate": 0.5},
            {"step": 2, "reward/mean": 0.3, "timing_s/step": 3.0, "env/call_rate": 1.0},
            {"step": 2, "val/accuracy": 0.75, "val/env/call_rate": 1.0, "val/env/drift_rate": 0.25,
             "val/env/drift_checked": 4.0}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "seed4.json"
    out.write_text(json.dumps({"summary": {"wall_s": 123.4, "stopped_at_limit": False}}))  # the training run's
    assert env_learning(monkeypatch).main(["--task", "search_examples", "--seed", "4", "--steps", "2",
                                           "--val-every", "2", "--val-size", "4", "--window", "1",
                                           "--runs-dir", str(runs), "--out", str(out), "--reuse"]) == 0
    result = json.loads(out.read_text())
    assert result["validation"] == [[0, 0.25], [2, 0.75]]
    assert result["validation_env"] == [
        {"step": 0, "val/env/call_rate": 0.5, "val/env/drift_rate": 0.0, "val/env/drift_checked": 4.0},
        {"step": 2, "val/env/call_rate": 1.0, "val/env/drift_rate": 0.25, "val/env/drift_checked": 4.0}]
    summary = result["summary"]
    assert (summary["val_call_rate_step0"], summary["val_call_rate_final"]) == (0.5, 1.0)
    assert summary["wall_s"] == 123.4 and summary["train_seconds"] == 5.0
    # sqrt(0.25 x 0.75 / 4 + 0.75 x 0.25 / 4) = sqrt(0.09375)
    assert summary["noise"]["binomial_se_of_difference"] == pytest.approx(math.sqrt(0.09375))
    assert summary["metrics_first_last"]["env/call_rate"] == {"first": 0.5, "last": 1.0, "min": 0.5, "max": 1.0,
                                                             "steps": 2}
    printed = capsys.readouterr().out
    assert "held-out accuracy 0.250 (step 0) -> 0.750 (step 2)" in printed
    assert "held-out call rate 0.500 (step 0) -> 1.000 (step 2)" in printed
    assert out.with_suffix(".png").stat().st_size > 0


def test_a_run_without_held_out_env_metrics_records_none(tmp_path, monkeypatch):
    module = env_learning(monkeypatch)
    assert module.validation_env([{"step": 0, "val/accuracy": 0.5}, {"step": 1, "reward/mean": 0.0}]) == []
