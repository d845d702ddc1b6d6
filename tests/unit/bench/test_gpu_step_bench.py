"""The step benchmark's library (reasonrl/bench/) and its script benchmarks/gpu_grpo_step.py: the per-step record from a train_step's metrics (hand-derived numbers), the
workload the trainer reads (prompts of exact length through the real tokenizer loader and PromptDataset), the
bench_random verifier plugin found through its entry point, and (slow) the CPU dry run writing its JSON."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest
from paths import REPO


BENCH = REPO / "benchmarks"


def test_step_record_from_train_step_metrics():
    from reasonrl.bench.probes import MemoryProbedGroup
    from reasonrl.bench.summary import summarize_step

    probed = MemoryProbedGroup(group=None, enabled=False)
    probed.response_lengths = [10, 30, 20, 40]  # 100 response tokens
    metrics = {"timing_s/rollout": 2.0, "timing_s/verify": 0.5, "timing_s/ref_log_probs": 1.0,
               "timing_s/advantages": 0.1, "timing_s/sleep": 0.2, "timing_s/update_actor": 4.0,
               "timing_s/weight_sync": 0.3, "timing_s/offload_actor": 0.05, "timing_s/step": 8.0,
               "perf/tokens_per_s": 100.0, "weight_sync/bytes": 123.0, "actor/kl": 0.5,
               "rollout/logprob_diff_mean": 0.01}
    rec = summarize_step(metrics, probed, n_params=10**9, gpus=2, prompt_len=16)
    assert rec["seconds"]["step"] == 8.0 and "offload_actor" not in rec["seconds"]
    assert rec["offload_timing_s"] == {"offload_actor": 0.05}
    assert rec["response_tokens"] == 100.0
    assert rec["all_tokens"] == 800.0  # perf/tokens_per_s x step seconds = 100 x 8
    assert rec["rollout_tokens_per_s"] == 50.0  # 100 response tokens / 2 s
    assert rec["rollout_tokens_per_s_per_gpu"] == 25.0
    assert rec["update_tokens_per_s"] == 200.0  # 800 tokens / 4 s
    assert rec["update_mfu"] == pytest.approx(6e9 * 200 / 2 / 989e12)
    assert rec["log_prob_mfu"] == pytest.approx(2e9 * 800 / 1.0 / 2 / 989e12)
    assert rec["sync_plus_sleep_wake_fraction_of_step"] == pytest.approx((0.3 + 0.2) / 8)
    assert rec["step_response_tokens_per_s_per_gpu"] == pytest.approx(100 / 8 / 2)
    # sorted lengths [10, 20, 30, 40]: min 10, median at index 2 = 30, max 40; padded = 4 rows x (16 + 40)
    assert (rec["response_length_min"], rec["response_length_median"], rec["response_length_max"]) == (10, 30.0, 40)
    assert rec["padded_tokens"] == 224.0
    assert rec["weight_sync_bytes"] == 123.0 and rec["actor_metrics"] == {"actor/kl": 0.5}


def test_prompts_are_exactly_prompt_len_tokens_as_the_trainer_reads_them(tmp_path):
    from transformers import Qwen2Config

    from reasonrl.bench.shapes import build_model_dir_tokenizer
    from reasonrl.bench.workload import write_prompt_dataset

    from reasonrl.data import PromptDataset
    from reasonrl.models import load_tokenizer

    vocab = 512
    # model_type qwen2: transformers 5 loads the directory's tokenizer as Qwen2Tokenizer (the case that broke words)
    Qwen2Config(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1).save_pretrained(tmp_path / "model")
    build_model_dir_tokenizer(vocab).save_pretrained(tmp_path / "model")
    tok = load_tokenizer(str(tmp_path / "model"))
    assert tok.eos_token_id == vocab - 1 and tok.pad_token_id == vocab - 1
    data = write_prompt_dataset(tmp_path / "prompts.jsonl", prompts=3, prompt_len=12, seed=0)
    ds = PromptDataset([str(data)], tok, max_prompt_length=12, apply_chat_template=False)
    assert [len(p.token_ids) for p in ds.prompts] == [12, 12, 12]
    assert all(p.row["verifier"] == "bench_random" for p in ds.prompts)
    assert tok.decode(ds.prompts[0].token_ids) == ds.prompts[0].row["prompt"][0]["content"]


def test_bench_random_verifier_is_found_through_its_entry_point():
    expected = int.from_bytes(hashlib.sha256(b"some response").digest()[:8], "big") / 2.0 ** 64
    code = ("from reasonrl.verifiers import get_verifier\n"
            "v = get_verifier('bench_random')\n"
            "a, b = v.verify('some response', 'none'), v.verify('another response', 'none')\n"
            "print(repr(a.score), a.correct, a.score != b.score, 0 <= b.score < 1)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BENCH / "plugins"), str(REPO)]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [repr(expected), str(expected >= 0.5), "True", "True"]


@pytest.mark.slow
def test_cpu_dry_run_writes_the_json(tmp_path):
    """The README's dry run (hf engine, in-process backend): two real train_steps, every response 16 tokens."""
    out = tmp_path / "step.json"
    cmd = [sys.executable, str(BENCH / "gpu_grpo_step.py"), "--shape", "tiny", "--engine", "hf", "--backend",
           "in-process", "--prompts", "2", "--n", "2", "--prompt-len", "16", "--response-len", "16", "--steps", "1",
           "--warmup", "1", "--micro-batch", "2", "--threads", "1", "--model-dir", str(tmp_path / "model"),
           "--out", str(out)]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=dict(os.environ, PYTHONPATH=str(REPO)))
    wall = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["status"] == "ok"
    # launch to the first step's end counts the process's start and imports: more than the trainer's own set-up,
    # less than the whole process (which ran a second step after it)
    assert result["setup_s"]["trainer_init"] < result["launch_to_first_step_s"] < wall
    step = result["steps"][0]
    assert (step["response_length_min"], step["response_length_max"]) == (16, 16)  # ignore_eos on the plan
    assert step["response_tokens"] == 2 * 2 * 16
    assert {"rollout", "verify", "ref_log_probs", "update_actor", "weight_sync", "step"} <= set(step["seconds"])
    assert step["weight_sync_bytes"] > 0 and result["mean"]["seconds"]["step"] > 0
