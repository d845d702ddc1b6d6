"""reasonrl/bench/trl_anchor.py: the TRL anchor's per-step record, mean, config arguments and JSON, with numbers
worked by hand."""
import json
from types import SimpleNamespace

import pytest

from reasonrl.bench.trl_anchor import ModeRecord, finish, grpo_config_kwargs, make_prompts, step_record


def test_step_record_splits_the_step_by_trl_blocks():
    # 10 s step; generate 2 + 1 = 3 s (two calls), sync 0.5 s, _prepare_inputs 6 s, compute_loss 1.5 s
    blocks = [("vLLM.generate", 2.0), ("sync_weights", 0.5), ("vLLM.generate", 1.0), ("_prepare_inputs", 6.0),
              ("compute_loss", 1.5)]
    r = step_record(3, 10.0, blocks, completion_tokens=300, prompt_tokens=100)
    assert r["global_step"] == 3 and r["generate_s"] == 3.0 and r["sync_weights_s"] == 0.5
    assert r["score_s"] == pytest.approx(6.0 - 3.0 - 0.5) and r["update_s"] == pytest.approx(4.0)
    assert r["profiling_block_calls"] == {"vLLM.generate": 2, "sync_weights": 1, "_prepare_inputs": 1,
                                          "compute_loss": 1}
    assert r["compute_loss_fwd_s"] == 1.5
    assert r["step_completion_tokens_per_s"] == 30.0 and r["step_total_tokens_per_s"] == 40.0
    assert r["generate_tokens_per_s"] == 100.0
    assert step_record(1, 2.0, [], 10, 0)["generate_tokens_per_s"] is None


def test_mode_record_writes_steps_mean_and_logs(tmp_path):
    out = tmp_path / "trl.json"
    rec = ModeRecord(out, "generate")
    rec.add_step(step_record(1, 4.0, [("transformers.generate", 2.0)], 8, 0), timed=False, on_gpu=False)
    assert "mean" not in rec.data  # warm-up steps give no mean
    rec.add_step(step_record(2, 4.0, [("transformers.generate", 2.0)], 8, 0), timed=True, on_gpu=False)
    rec.add_step(step_record(3, 6.0, [("transformers.generate", 2.0)], 16, 0), timed=True, on_gpu=False)
    rec.add_log(3, {"loss": 0.5, "note": "text"})
    mode = json.loads(out.read_text())["modes"]["generate"]
    assert [s["global_step"] for s in mode["steps"]] == [2, 3] and len(mode["warmup_steps"]) == 1
    assert mode["mean"]["seconds"] == 5.0 and mode["mean"]["generate_tokens_per_s"] == (8 + 16) / 4.0
    assert mode["logs"] == [{"global_step": 3, "loss": 0.5}] and mode["wall_s"] >= 0
    merged = finish(out, ["colocate", "generate"], {"generate": 0}, 12.0)
    assert merged["status"] == "failed"  # neither mode's status is ok (still running)
    assert merged["summary"] == {"colocate": None, "generate": mode["mean"]} and merged["wall_s"] == 12.0


def test_config_maps_one_step_to_all_completions(tmp_path):
    args = SimpleNamespace(prompts=4, n=4, micro_batch=4, steps=2, generate_steps=1, warmup=1, response_len=32,
                           prompt_len=16, beta=0.001, is_correction=False, gpu_memory_utilization=0.5,
                           sleep_mode=True)
    c = grpo_config_kwargs("colocate", args, on_gpu=False, out_dir=tmp_path)
    assert c["gradient_accumulation_steps"] == 4 and c["generation_batch_size"] == 16 and c["max_steps"] == 3
    assert c["vllm_max_model_length"] == 48 and c["vllm_enable_sleep_mode"] is False and c["use_cpu"] is True
    g = grpo_config_kwargs("generate", args, on_gpu=True, out_dir=tmp_path)
    assert g["max_steps"] == 2 and g["generation_kwargs"] == {"min_new_tokens": 32} and "vllm_mode" not in g


def test_prompts_are_the_seeded_draw():
    p = make_prompts(10, 3, 5)
    assert len(p) == 3 and all(len(x) == 5 and all(1 <= t <= 8 for t in x) for x in p)
    assert p == make_prompts(10, 3, 5)
