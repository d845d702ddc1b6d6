"""The fleet's restart budget is per run, across resumes (``replicas.save_fleet``/``load_fleet`` and the run's
restarts journal): a restart booked after the last checkpoint still counts when the same run directory resumes from
it; a resume into a fresh directory has only the checkpoint's. Real files, counts by hand."""
from __future__ import annotations

import pytest

from reasonrl.fleet.health import FleetHealth, HealthPolicy, RestartBudgetSpent
from reasonrl.trainer.fleet_journal import RESTARTS_FILE, append_restart, load_fleet, read_restarts, save_fleet


def book(ledger_dir, health: FleetHealth, name: str, cause: str) -> None:
    """What ``Replicas.book`` does: the restart counted, then journaled."""
    health.restart(name, cause)
    append_restart(ledger_dir / RESTARTS_FILE, {"replica": name, "cause": cause, "restart": health.restarts})


def healthy(budget: int) -> FleetHealth:
    health = FleetHealth(HealthPolicy(restart_budget=budget))
    health.add("replica0")
    health.add("replica1")
    return health


def test_a_restart_after_the_checkpoint_counts_when_the_run_resumes(tmp_path):
    ledger_dir, ckpt = tmp_path / "run" / "fleet", tmp_path / "run" / "checkpoints" / "step_000002"
    ledger_dir.mkdir(parents=True)
    ckpt.mkdir(parents=True)
    (ledger_dir / "round_000000.jsonl").write_text("{}\n")
    health = healthy(budget=2)
    book(ledger_dir, health, "replica1", "died: SIGKILL")  # step 1: restart 1
    save_fleet(ledger_dir, str(ckpt), health.restarts, reissued=2)  # step 2's checkpoint: 1 restart
    book(ledger_dir, health, "replica0", "hung")  # step 3: restart 2, then the trainer is killed
    (ledger_dir / "round_000002.jsonl").write_text("{}\n")  # a round past the checkpoint

    resumed = healthy(budget=2)
    assert load_fleet(ledger_dir, str(ckpt)) == (2, 2)  # 2 restarts (the run's), 2 re-issued (the checkpoint's)
    assert sorted(p.name for p in ledger_dir.iterdir()) == ["restarts.jsonl", "round_000000.jsonl"]
    assert [r["replica"] for r in read_restarts(ledger_dir / RESTARTS_FILE)] == ["replica1", "replica0"]
    resumed.restarts = 2
    with pytest.raises(RestartBudgetSpent, match="replica replica1 must be replaced .*budget of 2 is spent"):
        resumed.restart("replica1", "died: SIGKILL")


def test_a_resume_into_a_fresh_directory_has_the_checkpoints_restarts(tmp_path):
    ledger_dir, ckpt = tmp_path / "run" / "fleet", tmp_path / "ckpt"
    ledger_dir.mkdir(parents=True)
    ckpt.mkdir()
    health = healthy(budget=3)
    book(ledger_dir, health, "replica1", "died")
    save_fleet(ledger_dir, str(ckpt), health.restarts, reissued=0)
    book(ledger_dir, health, "replica1", "died")
    fresh = tmp_path / "other" / "fleet"
    assert load_fleet(fresh, str(ckpt)) == (1, 0)
    assert len(read_restarts(fresh / RESTARTS_FILE)) == 1  # the checkpoint's journal came along


def test_a_torn_last_line_is_not_a_restart(tmp_path):
    path = tmp_path / RESTARTS_FILE
    append_restart(path, {"replica": "replica0", "cause": "died", "restart": 1})
    with open(path, "ab") as f:
        f.write(b'{"replica": "repl')  # killed inside the write
    assert len(read_restarts(path)) == 1


def test_a_checkpoint_without_fleet_state_restores_nothing(tmp_path):
    assert load_fleet(tmp_path / "fleet", str(tmp_path / "ckpt")) is None
