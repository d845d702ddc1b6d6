"""benchmarks/learning_curve.run_seeds when a seed's training fails: it raises, naming the seed (the default), or,
with ``keep_failed`` (benchmarks/curriculum.py), records the failure and keeps the other seeds' curves; and
curriculum.finished_runs leaves the failed runs out of the comparison. The seeds are real processes: a stand-in
trainer script that writes a metrics.jsonl, and exits 3 for seed 2 after logging its step 0."""
from __future__ import annotations

import argparse
import textwrap

import pytest
from helpers import benchmark_module
from paths import REPO

STAND_IN = textwrap.dedent('''
    import json, pathlib, sys
    kv = dict(a.split("=", 1) for a in sys.argv[2:] if "=" in a)
    out = pathlib.Path(kv["trainer.output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    rows = [{"step": 0, "val/accuracy": 0.25}]
    if kv["trainer.seed"] != "2":
        rows += [{"step": 1, "reward/mean": 0.5, "timing_s/step": 1.5}, {"step": 1, "val/accuracy": 0.5}]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
    if kv["trainer.seed"] == "2":
        print("CUDA out of memory (stand-in)")
        sys.exit(3)
''')


@pytest.fixture
def lc(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    return benchmark_module("learning_curve")


def seeds_args(tmp_path, parallel: bool) -> argparse.Namespace:
    return argparse.Namespace(runs_dir=str(tmp_path / "runs"), steps=1, val_every=1, driver="local",
                              parallel=parallel, time_limit_s=0.0, reuse=False, seeds=[1, 2, 3])


@pytest.mark.parametrize("parallel", [False, True])
def test_a_failed_seed_is_kept_beside_the_others_with_keep_failed(lc, tmp_path, parallel):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    runs = lc.run_seeds("grpo", seeds_args(tmp_path, parallel), [], name="uniform", script=script, keep_failed=True)
    assert [r["seed"] for r in runs] == [1, 2, 3]
    one, two, three = runs
    assert "failed" not in one and "failed" not in three
    assert two["failed"]["exit"] == 3 and "CUDA out of memory (stand-in)" in two["failed"]["log_tail"]
    assert one["curves"]["val/accuracy"] == [[0, 0.25], [1, 0.5]] and one["train_seconds"] == 1.5
    assert two["curves"]["val/accuracy"] == [[0, 0.25]] and two["train_seconds"] == 0


def test_a_failed_seed_raises_by_default_naming_it(lc, tmp_path):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    with pytest.raises(RuntimeError, match=r"seed 2: training failed \(exit 3\)(.|\n)*CUDA out of memory"):
        lc.run_seeds("grpo", seeds_args(tmp_path, False), [], name="uniform", script=script)


def test_finished_runs_leave_the_failed_out_of_the_comparison(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    curriculum = benchmark_module("curriculum")
    ok, crashed = {"seed": 1}, {"seed": 2, "failed": {"exit": 3}}
    kept, failed = curriculum.finished_runs({"uniform": [ok, crashed], "pass_rate": [dict(crashed, seed=3)]})
    assert kept == {"uniform": [ok]}  # pass_rate has no run left: not compared at all
    assert failed == {"uniform": [2], "pass_rate": [3]}
