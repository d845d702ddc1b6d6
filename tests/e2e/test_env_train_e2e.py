"""The training command's ``main`` with task=search on CPU, in this process (``InProcessBackend``: no interpreter or
Ray start; the command on Ray: tests/e2e/test_train_e2e.py): one GRPO step with the real SmolLM2 (hf engine) and
FSDP2, at tiny settings. The rollout runs through the environment loop (the rows name the search environment and
travel with the prompt batch); the step must finish and log its metrics. Validation before it (2 test questions)
logs the held-out tool-call and drift rates (``val/env/*``)."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_search_task_trains_one_step(tmp_path, model_path):
    from reasonrl.datasets import read_rows, task_files
    from reasonrl.train import main as train_main
    from reasonrl.trainer.backends import InProcessBackend

    out = tmp_path / "run"
    args = ["task=search", "trainer.total_steps=1", "data.train_batch_size=2", "rollout.n=2",
            "rollout.max_new_tokens=32", "rollout.engine=hf", "reward.workers=1", "trainer.save_every=0",
            f"trainer.output_dir={out}", "trainer.logger=[console,jsonl]", "trainer.val_before_train=true",
            "data.val_limit=2", "data.val_batch_size=2", "trainer.log_val_samples=1"]
    assert train_main(args, backend=InProcessBackend()) == 0  # in this process: no interpreter or Ray start
    [val, row] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    # held out: 2 greedy trajectories, each called or not, each drift-checked
    assert val["step"] == 0 and val["val/env/call_rate"] in (0.0, 0.5, 1.0) and val["val/env/drift_checked"] == 2
    assert val["val/env/drift_rate"] == 0.0
    # trainer.log_val_samples=1: the first held-out question's greedy trajectory, at the validation's step
    [logged] = [json.loads(line) for line in (out / "val_samples.jsonl").read_text().splitlines() if line.strip()]
    first = read_rows(task_files("search", "val")[0])[0]
    assert logged["step"] == 0 and logged["ground_truth"] == first["reward_model"]["ground_truth"]
    assert logged["data_source"] == first["data_source"] and isinstance(logged["correct"], bool)
    assert row["step"] == 1 and 1 <= row["tool/turns_mean"] <= 4
    assert row["reward/mean"] == row["reward/mean"] and 0 < row["response_length/mean"] <= 32
    # real samples: a non-canonical token split is counted apart (env/noncanonical_rate), never as boundary drift
    assert row["env/drift_checked"] == 4 and row["env/drift_rate"] == 0.0 and 0 <= row["env/noncanonical_rate"] <= 1
