"""The real training command with task=math_tool: two PPO or GRPO steps on CPU with the real SmolLM2, FSDP2, the hf
engine and the real sandbox. The train file asks the model to copy a code block (``helpers.tool_copy_rows``), which
SmolLM2 does about half the time at temperature 1, so the steps train on trajectories with tool turns (tool tokens
masked). PPO (the critic too) is the session's one trained run (conftest's ``trained_run``: the command's ``main``
in this process on the in-process backend); GRPO runs the command itself on Ray through the continuous fleet."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import read_jsonl, tool_copy_rows

from reasonrl.datasets import write_parquet

pytestmark = pytest.mark.slow


def check_tool_steps(rows, value_key: str) -> None:
    """Two logged steps, each with finite tool, loss and reward metrics (``value_key``: the algorithm's own loss),
    and some trajectories that ran code and trained with its output's tokens in them."""
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for key in ("tool/turns_mean", "tool/calls", "tool/errors", "tool/timeouts", "tool/seconds",
                    "tool/output_token_fraction", "actor/pg_loss", "actor/grad_norm", "reward/mean", value_key):
            assert key in r and r[key] == r[key] and abs(r[key]) != float("inf"), key
        assert 1 <= r["tool/turns_mean"] <= 4 and 0 <= r["tool/output_token_fraction"] < 1
        assert r["tool/timeouts"] <= r["tool/errors"] <= r["tool/calls"]
        assert 0 < r["response_length/mean"] <= 32
    assert sum(r["tool/calls"] for r in rows) >= 1  # some trajectories ran code, and trained with tool turns
    assert any(r["tool/output_token_fraction"] > 0 for r in rows)


def test_ppo_math_tool_run_trains_two_steps_with_tool_turns(trained_run: Path):
    """PPO: the colocated loop, workers and sandbox in this process, without starting Ray (the critic's group on Ray:
    tests/e2e/test_ppo_e2e.py)."""
    check_tool_steps(read_jsonl(trained_run / "metrics.jsonl"), "critic/value_loss")


def test_grpo_math_tool_trains_two_steps_through_the_fleet(tmp_path, model_path):
    """GRPO runs the command itself on Ray, its rollouts multi-turn trajectories through the continuous fleet (one
    replica, ``fleet.continuous``, one batch ahead): the tool loop runs inside the replica, and the ledger shows every
    prompt trained once."""
    from reasonrl.trainer.fleet_journal import ledger_summary

    out = tmp_path / "run"
    train = write_parquet(tool_copy_rows(4), tmp_path / "copy.parquet")
    args = ["task=math_tool", "algorithm=grpo", "rollout.engine=hf", "data.train_batch_size=2", "rollout.n=2",
            "rollout.max_new_tokens=32", "actor.micro_batch_size_per_worker=4", "reward.workers=1",
            "trainer.total_steps=2", "trainer.save_every=0", f"trainer.output_dir={out}", f"data.train_files=[{train}]",
            "trainer.logger=[console,jsonl]", "trainer.mode=async", "fleet.enabled=true", "fleet.continuous=true",
            "async_rollout.num_rollout_workers=1", "async_rollout.max_staleness=1"]
    proc = subprocess.run([sys.executable, "-m", "reasonrl.train", *args], capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_jsonl(out / "metrics.jsonl")
    check_tool_steps(rows, "actor/kl_loss")
    assert all(r["async/staleness"] in (0.0, 1.0) for r in rows)
    assert ledger_summary(out / "fleet") == {"pending": 0, "issued": 0, "done": 0, "trained": 4, "failed": 0}
