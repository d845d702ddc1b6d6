"""benchmarks/learning_curve.py's ``--task`` (issue 50 item 4's GSM8K curve runs through it): an unknown task is
refused naming the built-in ones; a known one is prepared from its own recipe, named in every seed's command and in
the JSON, and summarised with the binomial yardstick worked by hand. ``--reuse`` reads a run's metrics instead of
training (written here: this checks the script's plumbing, not a training run)."""
from __future__ import annotations

import json
import math

import pyarrow.parquet as pq
import pytest
from helpers import benchmark_module


def learning_curve():
    return benchmark_module("learning_curve")


def test_an_unknown_task_is_refused_naming_the_built_in_ones(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        learning_curve().main(["--task", "no_such_task", "--runs-dir", str(tmp_path), "--reuse"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--task 'no_such_task'" in err and "gsm8k" in err and "countdown" in err


def test_a_task_is_prepared_named_and_summarised(tmp_path):
    runs = tmp_path / "runs"
    run_dir = runs / "levels_seed1"
    run_dir.mkdir(parents=True)
    rows = [{"step": 0, "val/accuracy": 0.25}, {"step": 1, "reward/mean": 0.1, "timing_s/step": 2.0},
            {"step": 2, "reward/mean": 0.3, "timing_s/step": 3.0, "val/accuracy": 0.5}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "levels.json"
    assert learning_curve().main(["--task", "arith_levels", "--label", "levels", "--seeds", "1", "--steps", "2",
                                  "--val-every", "2", "--val-size", "4", "--runs-dir", str(runs), "--out", str(out),
                                  "--reuse"]) == 0
    result = json.loads(out.read_text())
    assert result["task"] == "arith_levels"
    assert result["runs"][0]["command"].split()[2] == "task=arith_levels"
    sources = set(pq.read_table(runs / "data" / "train.parquet").column("data_source").to_pylist())
    assert sources == {"arith_easy", "arith_medium", "arith_hard"}  # the levels recipe's rows, not arith's
    summary = result["summary"]
    assert summary["gain"]["mean"] == pytest.approx(0.25)
    # sqrt(0.25 x 0.75 / 4 + 0.5 x 0.5 / 4) = sqrt(0.046875 + 0.0625)
    assert summary["noise"]["binomial_se_of_difference"] == pytest.approx(math.sqrt(0.109375))
    assert result["runs"][0]["train_seconds"] == 5.0
    assert out.with_suffix(".png").stat().st_size > 0
