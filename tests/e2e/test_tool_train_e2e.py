"""The real training command with task=math_tool: two GRPO or PPO steps (PPO: the critic too) on CPU with the real
SmolLM2, FSDP2, the hf engine and the real sandbox (GRPO on Ray, PPO in this process). The train file asks the model
to copy a code block, which SmolLM2 does about half the time at temperature 1, so the steps train on trajectories
with tool turns (tool tokens masked)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from reasonrl.datasets import write_parquet
from reasonrl.tools.python import SYSTEM_PROMPT
from reasonrl.train import main as train_main
from reasonrl.trainer.backends import InProcessBackend

pytestmark = pytest.mark.slow
COPY = "Copy this code block exactly, then say the number it prints:\n```python\nprint({a} * {b})\n```"


def copy_rows(count: int):
    return [{"data_source": "openai/gsm8k", "ability": "math", "verifier": "math",
             "prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                        {"role": "user", "content": COPY.format(a=6 + i, b=7)}],
             "reward_model": {"style": "rule", "ground_truth": str((6 + i) * 7)},
             "extra_info": {"split": "train", "index": i}} for i in range(count)]


@pytest.mark.parametrize("algorithm, backend", [("grpo", "ray-fleet"), ("ppo", "in-process")])
def test_math_tool_trains_two_steps(tmp_path, model_path, algorithm, backend):
    """GRPO runs the command itself on Ray, its rollouts multi-turn trajectories through the continuous fleet (one
    replica, ``fleet.continuous``, one batch ahead): the tool loop runs inside the replica, and the ledger shows every
    prompt trained once. PPO runs the command's ``main`` in this process with ``trainer.backends.InProcessBackend``:
    the colocated loop, workers and sandbox without starting Ray, which the critic's group on Ray does not need here
    (tests/e2e/test_ppo_e2e.py runs it)."""
    out = tmp_path / "run"
    train = write_parquet(copy_rows(4), tmp_path / "copy.parquet")
    args = ["task=math_tool", f"algorithm={algorithm}", "rollout.engine=hf", "data.train_batch_size=2", "rollout.n=2",
            "rollout.max_new_tokens=32", "actor.micro_batch_size_per_worker=4", "reward.workers=1",
            "trainer.total_steps=2", "trainer.save_every=0", f"trainer.output_dir={out}", f"data.train_files=[{train}]",
            "trainer.logger=[console,jsonl]"]
    if backend == "ray-fleet":
        args += ["trainer.mode=async", "fleet.enabled=true", "fleet.continuous=true",
                 "async_rollout.num_rollout_workers=1", "async_rollout.max_staleness=1"]
        proc = subprocess.run([sys.executable, "-m", "reasonrl.train", *args], capture_output=True, text=True,
                              timeout=1800)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    else:
        assert train_main(args, backend=InProcessBackend()) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for key in ("tool/turns_mean", "tool/calls", "tool/errors", "tool/timeouts", "tool/seconds",
                    "tool/output_token_fraction", "actor/pg_loss", "actor/grad_norm", "reward/mean",
                    *(["critic/value_loss"] if algorithm == "ppo" else ["actor/kl_loss"])):
            assert key in r and r[key] == r[key] and abs(r[key]) != float("inf"), key
        assert 1 <= r["tool/turns_mean"] <= 4 and 0 <= r["tool/output_token_fraction"] < 1
        assert r["tool/timeouts"] <= r["tool/errors"] <= r["tool/calls"]
        assert 0 < r["response_length/mean"] <= 32
    assert sum(r["tool/calls"] for r in rows) >= 1  # some trajectories ran code, and trained with tool turns
    assert any(r["tool/output_token_fraction"] > 0 for r in rows)
    if backend == "ray-fleet":
        from reasonrl.trainer.fleet_journal import ledger_summary

        assert all(r["async/staleness"] in (0.0, 1.0) for r in rows)
        assert ledger_summary(out / "fleet") == {"pending": 0, "issued": 0, "done": 0, "trained": 4, "failed": 0}
