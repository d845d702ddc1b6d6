"""A poison prompt on CPU with Ray (``fleet.poison``): two RolloutWorker replicas (hf engine) of conftest's
``tiny_policy``; every ``generate`` call holding prompt 1 (step 0, position 1) raises in its replica, which lives on
(fault action ``raise`` at ``fleet.prompt1.generate``, for its first 4 calls). ``fleet.max_restarts=0``: one replica
replaced would stop the run.

By hand, both sources route round 0's prompts 0..3 to replica0, replica1, replica0, replica1 (least outstanding,
ties to the first added) and send each replica one call: replica1's call of prompts 1 and 3 raises; both go again
alone (attempt 2) on replica0; prompt 3 answers, prompt 1 raises (alone on replica0: not yet poison) and goes
alone to replica1 (attempt 3), where it raises again: alone on 2 replicas, it is poison. Its 2 samples are recorded
failures, the round (4 prompts) trains on the 3 others and drops prompt 1 with the reason; no restart. One step a
run (each run is mostly Ray's and the replicas' start-up).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers import read_jsonl, ray_trainer

BASE = ["task=arith", "rollout.engine=hf", "data.train_batch_size=4", "rollout.n=2", "rollout.max_new_tokens=8",
        "actor.micro_batch_size_per_worker=8", "reward.workers=1", "trainer.logger=[jsonl]", "trainer.mode=async",
        "algorithm.use_kl_loss=false", "trainer.ray_address=local", "trainer.log_samples_every=1",
        "fleet.enabled=true", "async_rollout.num_rollout_workers=2", "fleet.max_restarts=0",
        "trainer.total_steps=1", "trainer.save_every=0"]
POISON = ",".join(f"fleet.prompt1.generate#{c}=raise" for c in range(1, 5))
REASON = "poison prompt: its generate call raised alone on replica0, replica1: FaultRaised: fault point: raise"


def run(policy, args, out: Path) -> dict:
    from reasonrl import fault_points

    mp = pytest.MonkeyPatch()
    mp.setenv(fault_points.ENV, POISON)
    mp.setattr(fault_points, "_hits", fault_points.Counter())
    trainer = ray_trainer(BASE, policy, list(args) + [f"trainer.output_dir={out}"])
    try:
        trainer.fit()
        return dict(fault_points._hits)
    finally:
        trainer.close()
        mp.undo()


def records(out: Path, step: int):
    return read_jsonl(out / "fleet" / f"round_{step:06d}.jsonl")[1:]


def check(out: Path, hits) -> None:
    assert hits["fleet.prompt1.generate"] == 3  # in 2 replicas' calls, then alone on each: never again
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1]
    assert rows[0]["fleet/restarts"] == 0 and rows[0]["fleet/round_dropped"] == 1
    assert rows[0]["fleet/round_reissued"] == 3 and rows[0]["reward/failed_count"] == 2  # 1 and 3, then 1 again
    first = records(out, 0)
    issues = [(r["i"], r["attempt"], r["replica"]) for r in first if r["op"] == "issue"]
    assert sorted(issues) == [(0, 1, "replica0"), (1, 1, "replica1"), (1, 2, "replica0"), (1, 3, "replica1"),
                              (2, 1, "replica0"), (3, 1, "replica1"), (3, 2, "replica0")]
    revoked = [(r["i"], r["attempt"]) for r in first if r["op"] == "revoke"]
    assert sorted(revoked) == [(1, 1), (1, 2), (3, 1)]
    assert all(r["reason"].endswith("raised: FaultRaised: fault point: raise") for r in first if r["op"] == "revoke")
    assert [(r["i"], r["reason"]) for r in first if r["op"] == "drop"] == [(1, REASON)]
    trained = sorted(r["i"] for r in first if r["op"] == "train")
    assert trained == [0, 2, 3]  # every other prompt trained once


@pytest.mark.slow
def test_a_prompt_raising_on_every_replica_is_dropped_without_a_restart(ray_session, tiny_policy, tmp_path):
    out = tmp_path / "round"
    check(out, run(tiny_policy, [], out))


@pytest.mark.slow
def test_continuous_generation_drops_a_poison_prompt_the_same_way(ray_session, tiny_policy, tmp_path):
    out = tmp_path / "continuous"
    check(out, run(tiny_policy, ["fleet.continuous=true", "async_rollout.max_staleness=0"], out))
