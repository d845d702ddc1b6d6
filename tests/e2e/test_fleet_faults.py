"""Two cases of the fleet's fault matrix (reasonrl/bench/fault_matrix.py; all of them: benchmarks/fleet_faults.py):
``python -m reasonrl.train`` with ``trainer.mode=async fleet.enabled=true`` (2 replicas on Ray, CPU, conftest's
``tiny_policy``; 4 steps, a checkpoint every 2) killed with SIGKILL at a fault point, resumed to the end with the same
command, its ledger compared with one uninterrupted run's (``fleet.audit``): every prompt trained exactly once.

- the trainer killed between step 4's publish (rounds 3 and 4 marked ``trained`` in the run's ledger) and its
  checkpoint: the resume restores step 2's checkpoint and its ledger, so those rounds are trained once, not twice;
- replica1 killed in step 3's round and the trainer as it revokes replica1's prompts (both): the round's half-revoked
  journal is not the resumed run's; its restart, booked after the checkpoint, still counts (the run's restarts
  journal: the budget is per run).
"""
from __future__ import annotations

import pytest

from reasonrl.bench.fault_matrix import CASES, KILLED, TOTAL_STEPS, reference_run, run_case

pytestmark = pytest.mark.slow


def case(fault: str):
    return next(c for c in CASES if c.fault == fault)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_policy):
    """The uninterrupted run (its ledger is what the interrupted ones must match)."""
    out = tmp_path_factory.mktemp("fleet_faults") / "reference"
    reference_run(out, tiny_policy)
    return out


def check(row, trained_at_kill: int) -> None:
    tail = "\n".join(row.get("output_tail", []))
    assert row["interrupted_exit"] == KILLED and row["final_exit"] == 0, tail
    assert row["trained_at_kill"] == trained_at_kill  # what the killed run's ledger held, checkpointed or not
    assert row["resumed_step"] == 2  # step 2's checkpoint: step 4's was never completed
    assert row["lost"] == 0 and row["duplicated"] == 0 and row["dropped"] == 0 and row["misplaced"] == 0, row
    assert row["trained"] == row["expected"] == TOTAL_STEPS * 4  # 4 prompts a round, each trained once
    assert row["steps_logged"] == list(range(1, TOTAL_STEPS + 1)) and row["ok"]


def test_a_trainer_killed_between_publish_and_checkpoint_trains_each_prompt_once(reference, tiny_policy, tmp_path):
    row = run_case(case("step.published#4=sigkill"), tmp_path / "run", tiny_policy, reference)
    assert row["faults_hit"] == ["step.published#4"]
    check(row, trained_at_kill=16)  # rounds 3 and 4 were trained in the run's ledger, beyond step 2's checkpoint


def test_a_replica_and_the_trainer_killed_train_each_prompt_once(reference, tiny_policy, tmp_path):
    row = run_case(case("fleet.replica1.generate#3=sigkill,fleet.replica_lost#1=sigkill"), tmp_path / "run",
                   tiny_policy, reference)
    assert row["faults_hit"] == ["fleet.replica1.generate#3", "fleet.replica_lost#1"]
    check(row, trained_at_kill=8)
    assert row["restarts"] == 1  # booked after the checkpoint the run resumed from: the run's journal keeps it
