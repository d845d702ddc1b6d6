"""fleet.enabled on CPU with Ray: two RolloutWorker replicas (hf engine) of conftest's ``tiny_policy`` behind the
fleet's router, one engine-less actor worker; plumbing (routing, replacement, the ledger), not learning.

One run of 2 steps (4 prompts x 2 samples a round) in which replica1 is killed (SIGKILL in its process, through the
fault point ``fleet.replica1.generate#2``) as step 2's round is handed to it: its 2 prompts go once to replica0, and a
new replica1 takes the weights. Then a resume of its checkpoint whose replica0 dies, with the budget (1) spent by the
first run, stops with the error naming the replica and the cause, the restored ledger intact.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import ray
from helpers import fit_and_close, planned_faults, read_jsonl, ray_trainer

TINY = ["task=arith", "rollout.engine=hf", "data.train_batch_size=4", "rollout.n=2", "rollout.max_new_tokens=8",
        "actor.micro_batch_size_per_worker=8", "reward.workers=1", "trainer.logger=[jsonl]", "trainer.mode=async",
        "algorithm.use_kl_loss=false", "trainer.ray_address=local", "trainer.log_samples_every=1",
        "fleet.enabled=true", "async_rollout.num_rollout_workers=2", "fleet.max_restarts=1"]


def make_trainer(policy, args):
    return ray_trainer(TINY, policy, args)


def fitted(policy, args, faults=None, keep=lambda trainer: None):
    """A trainer of ``args`` fitted under the fault plan ``faults`` (none by default), then closed; ``keep(trainer)``,
    read before the close."""
    with planned_faults(faults):
        return fit_and_close(make_trainer(policy, args), keep)


def first_metrics(run_dir: Path):
    return read_jsonl(run_dir / "metrics.jsonl")[0]


def journal(run_dir: Path, step: int):
    return read_jsonl(run_dir / "fleet" / f"round_{step:06d}.jsonl")[1:]


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory, ray_session, tiny_policy):
    """2 steps; replica1 killed as step 1's round is handed to it (its 2nd generate call); checkpoint at step 2; the
    weight-sync check on (every replica against the actor after each publish)."""
    out = tmp_path_factory.mktemp("fleet") / "run"
    versions = fitted(tiny_policy, ["trainer.total_steps=2", "trainer.save_every=2", "rollout.check_weight_sync=true",
                                    f"trainer.output_dir={out}"], faults="fleet.replica1.generate#2=sigkill",
                      keep=lambda trainer: trainer.rollouts.weights_version())
    return out, versions


@pytest.mark.slow
def test_a_round_through_two_replicas_is_complete_and_each_prompt_on_one(killed_run):
    out, _ = killed_run
    first = first_metrics(out)
    assert first["step"] == 1 and first["fleet/load/replica0"] == 2 and first["fleet/load/replica1"] == 2
    assert first["fleet/restarts"] == 0 and first["fleet/round_lost"] == 0
    issues = [r for r in journal(out, 0) if r["op"] == "issue"]
    assert sorted(r["i"] for r in issues) == [0, 1, 2, 3] and {r["attempt"] for r in issues} == {1}
    done = {r["i"]: r["payload"] for r in journal(out, 0) if r["op"] == "done"}
    # each prompt answered once, both its samples from the one replica it was issued to
    assert done == {r["i"]: {"replica": r["replica"], "samples": 2} for r in issues}


@pytest.mark.slow
def test_a_killed_replica_is_replaced_and_its_prompts_issued_once_more(killed_run):
    out, versions = killed_run
    second = read_jsonl(out / "metrics.jsonl")[1]
    assert second["step"] == 2 and second["fleet/restarts"] == 1 and second["fleet/replicas_alive"] == 2
    assert second["fleet/round_reissued"] == 2 and second["fleet/reissued"] == 2 and second["fleet/round_lost"] == 0
    records = journal(out, 1)
    lost = [r["i"] for r in records if r["op"] == "revoke"]
    assert len(lost) == 2 and all(r["reason"].startswith("replica replica1: died") for r in records
                                  if r["op"] == "revoke")
    again = [r for r in records if r["op"] == "issue" and r["i"] in lost and r["attempt"] == 2]
    assert sorted(r["i"] for r in again) == sorted(lost) and {r["replica"] for r in again} == {"replica0"}
    done = [r["i"] for r in records if r["op"] == "done"]
    assert sorted(done) == [4, 5, 6, 7]  # 0 lost, 0 duplicated
    trained = [r["i"] for step in (0, 1) for r in journal(out, step) if r["op"] == "train"]
    assert sorted(trained) == list(range(8))
    assert versions == [2, 2]  # the new replica1 took the weights as well


@pytest.mark.slow
def test_the_weight_sync_check_passes_each_replica_of_a_healthy_fleet(killed_run):
    """After each publish both replicas (at step 2 the new replica1 too) hold the published version and score the
    probe as the actor does (both float32 on CPU: well under the 0.1 bound)."""
    out, _ = killed_run
    for row in read_jsonl(out / "metrics.jsonl"):
        assert row["fleet/weight_sync/replicas_checked"] == 2
        for r in (0, 1):
            assert row[f"fleet/weight_sync/replica{r}/version"] == row["step"]
            assert row[f"fleet/weight_sync/replica{r}/mean_abs_diff"] < 1e-4
        assert row["weight_sync/logprob_diff_max"] < 1e-3


@pytest.mark.slow
def test_the_weight_sync_check_names_a_replica_that_did_not_load_the_weights(ray_session, tiny_policy, tmp_path):
    """replica1 skips the load of step 1's weights (fault action ``skip``): the check stops the run naming it and the
    version it holds (0); its log-probs are off as well (lr 1e-2 with an entropy bonus moves the tiny model's), while
    replica0 matches the actor."""
    from reasonrl.fleet.weight_check import StaleReplicaError

    with planned_faults("fleet.replica1.load_published#1=skip"):
        trainer = make_trainer(tiny_policy, ["trainer.total_steps=1", "trainer.save_every=0", "actor.lr=1e-2",
                                             "algorithm.entropy_coef=0.01", "rollout.check_weight_sync=true",
                                             "fleet.weight_sync_max_diff=1e-3", f"trainer.output_dir={tmp_path}"])
        try:
            with pytest.raises(StaleReplicaError, match=r"replica replica1 is stale after the weights of version 1 "
                                                        r"were published: it holds version 0") as caught:
                trainer.fit()
        finally:
            trainer.close()
    checked = {d.replica: d for d in caught.value.checked}
    assert checked["replica0"].version == 1 and checked["replica0"].mean_abs < 1e-4
    assert checked["replica1"].version == 0 and checked["replica1"].mean_abs > 1e-3


@pytest.mark.slow
def test_a_resumed_run_keeps_the_ledger_and_stops_when_the_budget_is_spent(killed_run, tiny_policy, tmp_path):
    from reasonrl.fleet.health import EXIT_FLEET_SPENT, RestartBudgetSpent
    from reasonrl.trainer.fleet_journal import ledger_summary

    out, _ = killed_run
    ckpt = tmp_path / "step_000002"
    shutil.copytree(out / "checkpoints" / "step_000002", ckpt)
    assert ledger_summary(ckpt / "fleet")["trained"] == 8
    again = tmp_path / "resumed"
    with planned_faults("fleet.replica0.generate#1=sigkill"):
        trainer = make_trainer(tiny_policy, ["trainer.total_steps=3", f"trainer.output_dir={again}",
                                             f"trainer.resume={ckpt}"])
        try:
            with pytest.raises(RestartBudgetSpent, match=r"replica replica0 must be replaced \(died: .*budget of 1 "
                                                         r"is spent") as caught:
                trainer.fit()
            assert caught.value.exit_status == EXIT_FLEET_SPENT
        finally:
            trainer.close()
    summary = ledger_summary(again / "fleet")  # the checkpoint's rounds, then step 2's, its dead replica's revoked
    assert summary["trained"] == 8 and summary["issued"] == 0
    assert summary["pending"] + summary["done"] == 4 and summary["pending"] >= 1


@pytest.mark.slow
def test_a_replica_on_a_call_longer_than_the_watchdog_is_not_replaced(ray_session, tiny_policy, tmp_path):
    """Each replica's one call of the round (2 prompts x 2 samples of up to 512 tokens: about 5 s of the tiny
    policy's decoding on this machine) outlasts the 1.5 s watchdog. Their engines' steps reach the progress board
    while the calls run (``fleet.progress``), so neither is replaced; going by answers alone, both were, and the run
    stopped (its restart budget is 1). No off-policy correction, so no log-prob pass after the decoding: the hf
    engine counts that pass as one step a micro-batch, and its one micro-batch here took 1-2 s."""
    board = fitted(tiny_policy, ["trainer.total_steps=1", "trainer.save_every=0", "fleet.watchdog_s=1.5",
                                 "rollout.max_new_tokens=512", "algorithm.off_policy.correction=none",
                                 f"trainer.output_dir={tmp_path}"], keep=lambda trainer: trainer.source.fleet.board)
    row = first_metrics(tmp_path)
    assert row["fleet/restarts"] == 0 and row["fleet/round_lost"] == 0 and row["fleet/round_reissued"] == 0
    assert row["timing_s/rollout"] > 1.5  # the calls did outlast the watchdog (about 5 s here)
    with pytest.raises(ray.exceptions.RayActorError):  # the trainer's close stopped its progress board
        ray.get(board.read.remote())


@pytest.mark.slow
def test_a_hung_replica_is_replaced_after_the_watchdog(ray_session, tiny_policy, tmp_path):
    """replica0 blocks before its first generate (fault action ``hang``): after ``fleet.watchdog_s`` it is replaced
    and its prompts go to replica1 (a healthy replica answers 2 prompts x 8 tokens of the tiny model in well under
    the 5 s). Then replica1 blocks before the weight-sync check after the publish: it is replaced too, and its
    replacement is checked in its place."""
    fitted(tiny_policy, ["trainer.total_steps=1", "trainer.save_every=0", "fleet.watchdog_s=5", "fleet.max_restarts=2",
                         "rollout.check_weight_sync=true", f"trainer.output_dir={tmp_path}"],
           faults="fleet.replica0.generate#1=hang,fleet.replica1.check_weights#1=hang")
    row = first_metrics(tmp_path)
    assert row["fleet/restarts"] == 1 and row["fleet/round_reissued"] == 2 and row["fleet/round_lost"] == 0
    records = journal(tmp_path, 0)
    revoked = [r for r in records if r["op"] == "revoke"]
    assert len(revoked) == 2 and all(r["reason"].startswith("replica replica0: hung") for r in revoked)
    assert {r["replica"] for r in records if r["op"] == "issue" and r["attempt"] == 2} == {"replica1"}
    assert sorted(r["i"] for r in records if r["op"] == "done") == [0, 1, 2, 3]
    restarts = read_jsonl(tmp_path / "fleet" / "restarts.jsonl")
    assert [(r["replica"], r["cause"]) for r in restarts] == [
        ("replica0", restarts[0]["cause"]), ("replica1", "hung past 5 s in the weight-sync check")]
    assert restarts[0]["cause"].startswith("hung")
    # both replicas checked after the publish, replica1's replacement at the published version
    assert row["fleet/weight_sync/replicas_checked"] == 2
    assert row["fleet/weight_sync/replica0/version"] == row["fleet/weight_sync/replica1/version"] == 1
    assert row["fleet/weight_sync/replica1/mean_abs_diff"] < 1e-4


@pytest.mark.slow
def test_a_replica_that_cannot_be_checked_twice_stops_the_run_named(ray_session, tiny_policy, tmp_path):
    """replica1 and then its replacement block before the weight-sync check: the run stops naming replica1 and why
    (a check that cannot say what a replica holds does not pass it)."""
    from reasonrl.fleet.weight_check import EXIT_STALE_REPLICA, UncheckedReplicaError

    with planned_faults("fleet.replica1.check_weights#1=hang,fleet.replica1.check_weights#2=hang"):
        trainer = make_trainer(tiny_policy, ["trainer.total_steps=1", "trainer.save_every=0", "fleet.watchdog_s=3",
                                             "fleet.max_restarts=2", "rollout.check_weight_sync=true",
                                             f"trainer.output_dir={tmp_path}"])
        try:
            with pytest.raises(UncheckedReplicaError, match=r"replica replica1 could not be checked .* it hung past "
                                                            r"3 s in the weight-sync check, and so did the replacement"):
                trainer.fit()
        finally:
            trainer.close()
    assert UncheckedReplicaError.exit_status == EXIT_STALE_REPLICA
    assert [r["replica"] for r in read_jsonl(tmp_path / "fleet" / "restarts.jsonl")] == ["replica1"]
