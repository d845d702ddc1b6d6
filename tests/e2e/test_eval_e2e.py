"""The real ``python -m reasonrl.eval`` on the first GSM8K test problems with SmolLM2-135M on CPU (hf engine).

One run is interrupted with SIGINT right after its first batch is on disk (a fault point, REASONRL_FAULT_AT); the
same command then resumes from the stored samples, and a third run finds everything done and generates nothing.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from components import VLLM, require, vllm_ready

from reasonrl.eval.cli import main as eval_main
from reasonrl.eval.metrics import maj_at_k, pass_at_k

pytestmark = pytest.mark.slow

LIMIT, N = 3, 2


def _env():
    # One torch thread per process: the CI machine has 2 shared cores, where more threads only contend.
    return dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                OMP_NUM_THREADS="1")


def _args(out: Path, *extra: str):
    return ["task=gsm8k", f"eval.limit={LIMIT}", f"eval.n={N}", "eval.k=[1,2]", "eval.temperature=1.0",
            "eval.max_new_tokens=24", "eval.batch_size=1", "rollout.engine=hf", "reward.workers=1",
            f"eval.output_dir={out}", *extra]


def _command(out: Path, *extra: str):
    return [sys.executable, "-m", "reasonrl.eval", *_args(out, *extra)]


def _lines(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.timeout(1500)
def test_eval_command_interrupt_resume_and_reuse(tmp_path, capsys):
    out = tmp_path / "eval"
    samples = out / "samples.jsonl"

    # Run 1: interrupted (SIGINT, as Ctrl-C) right after the first verified batch (one problem) is on disk: the
    # fault point makes the eval signal itself there, so the interruption always lands at the same place.
    proc = subprocess.run(_command(out), env=dict(_env(), REASONRL_FAULT_AT="eval.batch_stored#1=sigint"),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    log1 = proc.stdout
    first = _lines(samples)
    assert proc.returncode == 130, log1[-3000:]
    assert len(first) == 1, log1[-3000:]
    assert "run the same command again to resume" in log1
    assert not (out / "summary.json").exists()  # written only when every problem is done
    assert all(len(r["responses"]) == N and len(r["correct"]) == N for r in first)

    # Run 2: the same command resumes; it samples only the problems not on disk.
    run2 = subprocess.run(_command(out), env=_env(), capture_output=True, text=True, timeout=900)
    assert run2.returncode == 0, run2.stdout[-3000:] + run2.stderr[-3000:]
    assert f"resuming: {len(first)} of {LIMIT} problems" in run2.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_problems"] == len(first)
    assert summary["generated_problems"] == LIMIT - len(first)
    second = _lines(samples)
    assert second[:len(first)] == first  # stored lines untouched; new problems appended
    assert sorted(r["problem"] for r in second) == list(range(LIMIT))

    # The summary agrees with the per-problem table.
    table = pq.read_table(out / "samples.parquet").to_pylist()
    assert [t["problem"] for t in table] == list(range(LIMIT))
    for t in table:
        assert t["data_source"] == "openai/gsm8k" and t["ground_truth"]
        assert len(t["responses"]) == len(t["extracted"]) == len(t["reasons"]) == len(t["timed_out"]) == N
        assert all(isinstance(r, str) and r for r in t["reasons"])  # every verdict says why
        assert t["num_correct"] == sum(t["correct"])
        assert t["pass@1"] == pytest.approx(pass_at_k(N, t["num_correct"], 1))
    overall = summary["metrics"]["overall"]
    correct = sum(t["num_correct"] for t in table)
    assert (overall["problems"], overall["samples"], overall["correct"]) == (LIMIT, LIMIT * N, correct)
    assert overall["mean_accuracy"] == pytest.approx(correct / (LIMIT * N))
    assert overall["pass@2"] == pytest.approx(sum(pass_at_k(N, t["num_correct"], 2) for t in table) / LIMIT)
    assert overall["maj@2"] == pytest.approx(sum(maj_at_k(t["extracted"], t["correct"], 2) for t in table) / LIMIT)
    assert summary["metrics"]["by_data_source"]["openai/gsm8k"]["problems"] == LIMIT
    assert summary["engine"] == "hf" and summary["n"] == N and summary["k"] == [1, 2]
    assert "pass@2" in run2.stdout and "overall" in run2.stdout  # the printed table

    # Run 3: everything is on disk, so nothing is generated (no engine is even started) and nothing appended. Runs 3
    # and 4 call the command's main in this process (runs 1 and 2 ran the command itself): no interpreter start.
    capsys.readouterr()
    assert eval_main(_args(out)) == 0, capsys.readouterr().err[-3000:]
    summary3 = json.loads((out / "summary.json").read_text())
    assert summary3["generated_problems"] == 0 and summary3["resumed_problems"] == LIMIT
    assert summary3["engine"] is None
    assert summary3["metrics"] == summary["metrics"]
    assert _lines(samples) == second

    # Changing what the samples depend on is refused instead of mixing samples.
    capsys.readouterr()
    assert eval_main(_args(out, "eval.max_new_tokens=16")) == 2 and "max_new_tokens" in capsys.readouterr().err


@pytest.mark.timeout(900)
def test_greedy_eval_of_a_checkpoint_directory(tmp_path, trained_run):
    """eval.n=1 at temperature 0 (the defaults) on a training checkpoint's directory (the session's trained run: its
    final checkpoint, whose <dir>/hf holds the export), with the default eval.k."""
    ckpt = trained_run / "checkpoints" / "step_000002"
    assert (ckpt / "hf" / "config.json").exists(), sorted(p.name for p in (trained_run / "checkpoints").iterdir())
    out = tmp_path / "greedy"
    cmd = [sys.executable, "-m", "reasonrl.eval", "task=gsm8k", f"model.path={ckpt}", "eval.limit=1",
           "eval.max_new_tokens=16", "rollout.engine=hf", "reward.workers=1", f"eval.output_dir={out}"]
    run = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model_path"] == str(ckpt / "hf")
    assert summary["temperature"] == 0.0 and summary["n"] == 1
    assert summary["metrics"]["overall"]["samples"] == 1
    row = pq.read_table(out / "samples.parquet").to_pylist()[0]
    assert len(row["responses"]) == 1 and 1 <= row["num_tokens"][0] <= 16
    assert row["finish_reasons"][0] in ("stop", "length")


def test_greedy_with_several_samples_is_refused(tmp_path, capsys):
    """eval.temperature=0 given explicitly with eval.n>1 would repeat one answer: a clear error, before loading (the
    command's main, in this process)."""
    args = ["task=gsm8k", "eval.n=4", "eval.k=[1,4]", "eval.temperature=0", f"eval.output_dir={tmp_path}"]
    assert eval_main(args) == 2 and "eval.temperature" in capsys.readouterr().err


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_eval_with_the_vllm_engine(tmp_path):
    """The same command on vLLM (CPU build), run in-process: samples are generated, verified and summarized."""
    require(VLLM, *vllm_ready())
    out = tmp_path / "vllm"
    cmd = [sys.executable, "-m", "reasonrl.eval", "task=gsm8k", "eval.limit=1", "eval.n=2", "eval.k=[1,2]",
           "eval.temperature=1.0", "eval.max_new_tokens=16", "rollout.engine=vllm", "reward.workers=1",
           f"eval.output_dir={out}"]
    run = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=800)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine"] == "vllm" and summary["generated_problems"] == 1
    row = pq.read_table(out / "samples.parquet").to_pylist()[0]
    assert len(row["responses"]) == 2 and all(1 <= t <= 16 for t in row["num_tokens"])
    assert summary["metrics"]["overall"]["correct"] == row["num_correct"]
