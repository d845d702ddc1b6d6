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

A prompt that *kills* every replica whose call holds it (``sigkill`` at ``fleet.prompt1.generate``: the replica's
process dies when it reaches that call), ``FleetSource``, ``fleet.max_restarts=2``. By hand: replica0 gets prompts 0
and 2, replica1 prompts 1 and 3 (attempt 1), one call each. replica1 dies running its call: prompts 1 and 3 are on
its record (lost, not alone) and isolated, revoked (attempts 1), restart 1 is booked, and both go again, alone, to
replica0, the only replica in the router (attempt 2, two calls, prompt 1's first); replica1's replacement starts.
replica0 answers prompts 0 and 2, then dies reaching prompt 1's call: prompt 1, alone in the call that ran, has 2
replicas on its record: poison, answered with its 2 failed samples (attempt 2 done); prompt 3's call never ran: it is
revoked (attempt 2), restart 2 is booked, and it goes alone to replica1's replacement (attempt 3), which answers.
``fleet.prompt1.generate`` is reached twice; prompts 0, 2 and 3 are trained once, prompt 1 dropped with the reason.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers import planned_faults, read_jsonl, ray_trainer

BASE = ["task=arith", "rollout.engine=hf", "data.train_batch_size=4", "rollout.n=2", "rollout.max_new_tokens=8",
        "actor.micro_batch_size_per_worker=8", "reward.workers=1", "trainer.logger=[jsonl]", "trainer.mode=async",
        "algorithm.use_kl_loss=false", "trainer.ray_address=local", "trainer.log_samples_every=1",
        "fleet.enabled=true", "async_rollout.num_rollout_workers=2", "fleet.max_restarts=0",
        "trainer.total_steps=1", "trainer.save_every=0"]
POISON = ",".join(f"fleet.prompt1.generate#{c}=raise" for c in range(1, 5))
REASON = "poison prompt: its generate call raised alone on replica0, replica1: FaultRaised: fault point: raise"


KILLER = ",".join(f"fleet.prompt1.generate#{c}=sigkill" for c in range(1, 4))  # a third would spend the budget
KILLED = "poison prompt: replicas replica1, replica0 were lost while it was in their calls, the last time alone: died: "


def run(policy, args, out: Path, faults: str = POISON) -> dict:
    with planned_faults(faults) as hits:
        trainer = ray_trainer(BASE, policy, list(args) + [f"trainer.output_dir={out}"])
        try:
            trainer.fit()
            return dict(hits)
        finally:
            trainer.close()


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


@pytest.mark.slow
def test_a_prompt_killing_every_replica_is_dropped_after_two_restarts(ray_session, tiny_policy, tmp_path):
    out = tmp_path / "killer"
    hits = run(tiny_policy, ["fleet.max_restarts=2"], out, KILLER)
    assert hits["fleet.prompt1.generate"] == 2  # in replica1's call of prompts 1 and 3, then alone on replica0
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1]
    assert rows[0]["fleet/restarts"] == 2 and rows[0]["fleet/round_dropped"] == 1
    assert rows[0]["fleet/round_reissued"] == 3 and rows[0]["reward/failed_count"] == 2  # 1 and 3, then 3 again
    assert [r["replica"] for r in read_jsonl(out / "fleet" / "restarts.jsonl")] == ["replica1", "replica0"]
    first = records(out, 0)
    issues = [(r["i"], r["attempt"], r["replica"]) for r in first if r["op"] == "issue"]
    assert sorted(issues) == [(0, 1, "replica0"), (1, 1, "replica1"), (1, 2, "replica0"), (2, 1, "replica0"),
                              (3, 1, "replica1"), (3, 2, "replica0"), (3, 3, "replica1")]
    revoked = [(r["i"], r["attempt"]) for r in first if r["op"] == "revoke"]
    assert sorted(revoked) == [(1, 1), (3, 1), (3, 2)]
    assert all(": died: " in r["reason"] for r in first if r["op"] == "revoke")
    dropped = [(r["i"], r["reason"]) for r in first if r["op"] == "drop"]
    assert len(dropped) == 1 and dropped[0][0] == 1 and dropped[0][1].startswith(KILLED)
    trained = sorted(r["i"] for r in first if r["op"] == "train")
    assert trained == [0, 2, 3]  # every other prompt trained once
