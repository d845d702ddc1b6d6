"""The big guarantee: N steps straight equal an interrupted run resumed and finished — same weights, same data
order and samples, same metrics rows, none twice — for Ctrl-C (SIGINT) and kill -9 at several phases (two
interruptions of each kind, all four in one run, resumed after each).

Real runs on CPU: Ray, FSDP2, the hf engine with seeded sampling, on a tiny random Llama with SmolLM2's tokenizer
(conftest's ``tiny_policy``): exactness is plumbing (RNG, sampler, optimizer and data state), not what the model
knows, and each of the six training processes then costs little more than its start-up. Each interruption lands
at an exact place: the run signals itself at a named fault point (``REASONRL_FAULT_AT``, see reasonrl/fault_points.py),
so nothing depends on timing.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

STEPS = 3
# A random model cannot solve GSM8K in 8 tokens, so every reward is 0 and the advantages vanish; the entropy bonus
# keeps a gradient, so the weights move each step and "same weights" means something.
# The curriculum's sampler (data.sampler=pass_rate): its draws depend on the per-prompt statistics, which the checkpoint
# must carry exactly too (the default epoch sampler's state, {epoch, offset}, is the same code as before it).
ARGS = ["task=gsm8k", "data.sampler=pass_rate", "rollout.engine=hf", "data.train_batch_size=2", "rollout.n=2",
        "rollout.max_new_tokens=8",
        "actor.micro_batch_size_per_worker=4", "actor.lr=1e-4", "algorithm.entropy_coef=0.01", "reward.workers=1",
        "trainer.logger=[jsonl]", "trainer.log_samples_every=1", f"trainer.total_steps={STEPS}",
        "trainer.keep_checkpoints=0"]
VOLATILE = ("timing_s/", "startup_s/", "perf/", "verify/latency")  # wall-clock measurements: the only metrics allowed to differ


def run_train(out: Path, policy: str, *extra: str, fault: str = ""):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("REASONRL_FAULT_AT", None)
    if fault:
        env["REASONRL_FAULT_AT"] = fault
    # A session of its own: a sigkill fault point kills the whole group (Ray's processes too), as kill -9 of a job.
    return subprocess.run([sys.executable, "-m", "reasonrl.train", *ARGS, f"model.path={policy}", f"trainer.output_dir={out}",
                           *extra],
                          capture_output=True, text=True, timeout=1200, env=env, start_new_session=True)


def rows(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def outcome(out: Path):
    """What must match: metrics rows (wall-clock keys aside), samples, final data position and weights."""
    from safetensors.torch import load_file

    metrics = [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows(out / "metrics.jsonl")]
    final = out / "checkpoints" / f"step_{STEPS:06d}"
    state = json.loads((final / "trainer_state.json").read_text())
    weights = load_file(str(next((final / "hf").glob("*.safetensors"))))
    return metrics, rows(out / "samples.jsonl"), state["sampler"], weights


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tiny_policy):
    from safetensors.torch import load_file

    out = tmp_path_factory.mktemp("straight") / "run"
    proc = run_train(out, tiny_policy, f"trainer.save_every={STEPS}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "CPU profile" in proc.stdout and "responses per step" in proc.stdout  # the laptop's notice
    result = outcome(out)
    initial = load_file(str(next(Path(tiny_policy).glob("*.safetensors"))))
    assert any(not torch.equal(t, initial[n]) for n, t in result[3].items() if n in initial)  # training moved them
    assert all(r["actor/grad_norm"] > 0 for r in result[0])
    for r in result[0]:  # every step's metrics there and finite
        for key in ("reward/mean", "reward/accuracy", "response_length/mean", "actor/kl", "actor/entropy",
                    "actor/clip_frac", "actor/grad_norm", "actor/lr"):
            assert key in r and r[key] == r[key] and abs(r[key]) != float("inf"), key
        assert 0 < r["response_length/mean"] <= 8
    from transformers import AutoModelForCausalLM

    # the final checkpoint's Hugging Face export loads as a model, with the trained weights
    exported = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / f"step_{STEPS:06d}" / "hf")
    base = AutoModelForCausalLM.from_pretrained(tiny_policy)
    trained = dict(exported.named_parameters())
    assert max((trained[n] - w).abs().max().item() for n, w in base.named_parameters()) > 0
    return result


# One chain interrupts one run in four places, resuming it after each, then resumes it to the end: every training
# process starts Ray and loads the model (CI's dearest part), so the four interruptions share their runs. Fault
# counts are per process: in a run resumed at step 1, the first generate, update or checkpoint is step 2's.
# (fault point, save_every, expected exit status, the checkpoint the next run must resume from), in order:
CHAIN = [
    # Ctrl-C while step 1's checkpoint is being written: the save completes, then the run stops.
    ("checkpoint.written#1=sigint", 1, 130, 1),
    # Resumed at step 1, Ctrl-C while the workers generate step 2's rollouts: step 2 finishes and is saved though no
    # save was due.
    ("group.generate#1=sigint", STEPS, 130, 2),
    # Resumed at step 2, kill -9 in step 3's actor update: step 2's checkpoint is the resume point.
    ("group.update_actor#1=sigkill", 1, -signal.SIGKILL, 2),
    # Resumed at step 2 again, kill -9 while step 3's checkpoint is written (its metrics row is already logged):
    # resume from step 2 again and log step 3 once.
    ("checkpoint.written#1=sigkill", 1, -signal.SIGKILL, 2),
]


def resumed_line(out: Path, step: int) -> str:
    return f"resumed from {out / 'checkpoints' / f'step_{step:06d}'} at step {step}"


@pytest.mark.timeout(3600)
def test_a_run_interrupted_four_times_and_resumed_equals_the_straight_run(tmp_path, tiny_policy, straight):
    out = tmp_path / "run"
    resume_from = None
    for fault, save_every, status, resume_step in CHAIN:
        run = run_train(out, tiny_policy, f"trainer.save_every={save_every}", fault=fault)
        log = f"{fault}: " + run.stdout[-3000:] + run.stderr[-3000:]
        assert run.returncode == status, log
        assert "Traceback" not in run.stderr, log
        if resume_from is not None:
            assert resumed_line(out, resume_from) in run.stdout, log
        if status == 130:
            assert f"interrupted — step {resume_step} saved" in run.stdout, log
        resume_from = resume_step

    last = run_train(out, tiny_policy, f"trainer.save_every={save_every}")
    assert last.returncode == 0, last.stdout[-3000:] + last.stderr[-3000:]
    assert resumed_line(out, resume_from) in last.stdout

    metrics, samples, sampler, weights = outcome(out)
    want_metrics, want_samples, want_sampler, want_weights = straight
    assert [r["step"] for r in metrics] == list(range(1, STEPS + 1))  # every step logged once
    assert metrics == want_metrics
    assert samples == want_samples  # same prompts in the same order, same sampled responses and rewards
    assert sampler == want_sampler
    assert weights.keys() == want_weights.keys()
    for name, tensor in weights.items():
        assert torch.equal(tensor, want_weights[name]), name
