"""fleet.continuous on CPU with Ray: two RolloutWorker replicas (hf engine) of conftest's ``tiny_policy`` generating
all the time, paced by admission (``async_rollout.max_staleness``); plumbing (pacing, partial rollouts, replacement,
the ledger across a stop and a resume), not learning.

Run A (k = 1, whole responses): 4 steps; replica1 is killed (SIGKILL, fault point ``fleet.replica1.generate#2``)
as its second call is sent; the weight-sync check runs on every replica after each publish. Run B (k = 2,
``rollout.partial`` in segments of 2 tokens, LoRA: adapters staged on the replicas): stopped by Ctrl-C as step 2
begins (it finishes step 2, saves it and stops), then resumed to 4 steps from that checkpoint.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers import fit_and_close, planned_faults, read_jsonl, ray_trainer

BATCH = 4
BASE = ["task=arith", "rollout.engine=hf", f"data.train_batch_size={BATCH}", "rollout.n=2",
        "rollout.max_new_tokens=8", "actor.micro_batch_size_per_worker=8", "reward.workers=1",
        "trainer.logger=[jsonl]", "trainer.mode=async", "algorithm.use_kl_loss=false", "trainer.ray_address=local",
        "trainer.log_samples_every=1", "fleet.enabled=true", "fleet.continuous=true",
        "async_rollout.num_rollout_workers=2", "fleet.max_restarts=1"]


def run(policy, args, out: Path, fault: str = ""):
    with planned_faults(fault):
        trainer = ray_trainer(BASE, policy, list(args) + [f"trainer.output_dir={out}"])
        return fit_and_close(trainer, keep=lambda t: t.interrupted)


def trained_ids(run_dir: Path):
    """Every ``train`` record of the run's journals: the prompt ids, with repeats."""
    return sorted(r["i"] for path in sorted((run_dir / "fleet").glob("round_*.jsonl"))
                  for r in read_jsonl(path)[1:] if r["op"] == "train")


@pytest.fixture(scope="module")
def run_a(tmp_path_factory, ray_session, tiny_policy):
    out = tmp_path_factory.mktemp("continuous") / "a"
    run(tiny_policy, ["trainer.total_steps=4", "trainer.save_every=0", "async_rollout.max_staleness=1",
                      "rollout.check_weight_sync=true"], out, fault="fleet.replica1.generate#2=sigkill")
    return out


@pytest.fixture(scope="module")
def run_b(tmp_path_factory, ray_session, tiny_policy):
    out = tmp_path_factory.mktemp("continuous") / "b"
    args = ["trainer.total_steps=4", "trainer.save_every=0", "async_rollout.max_staleness=2", "rollout.partial=true",
            "rollout.partial_segment_tokens=2", "actor.lora.rank=4"]
    stopped = run(tiny_policy, args, out, fault="step.begin#2=sigint")
    pending = None
    ckpt = out / "checkpoints" / "step_000002"
    if (ckpt / "continuous_pending.pkl").exists():
        import pickle

        with open(ckpt / "continuous_pending.pkl", "rb") as f:
            pending = sorted(pickle.load(f))
    resumed = run(tiny_policy, args + ["trainer.resume=auto"], out)
    return out, stopped, resumed, pending


@pytest.mark.slow
def test_admission_bounds_the_lag_and_a_lost_replica_loses_no_prompt(run_a):
    rows = read_jsonl(run_a / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert r["async/staleness"] in (0.0, 1.0) and r["fleet/round_lost"] == 0
        assert r["admission/in_flight"] + r["admission/ready"] <= 2 * BATCH  # (k + 1) batches at most
    last = rows[-1]
    # 16 groups trained, each at lag 0 or 1, none beyond k = 1
    assert last["admission/lag_groups/0"] + last["admission/lag_groups/1"] == 4 * BATCH
    assert last["fleet/restarts"] == 1 and last["fleet/reissued"] >= 1 and last["fleet/replicas_alive"] == 2
    assert trained_ids(run_a) == list(range(4 * BATCH))  # 0 lost, 0 duplicated
    revoked = [r for path in (run_a / "fleet").glob("round_*.jsonl") for r in read_jsonl(path)[1:]
               if r["op"] == "revoke"]
    assert revoked and all(r["reason"].startswith("replica replica1: died") for r in revoked)


@pytest.mark.slow
def test_the_weight_sync_check_passes_each_replica_while_generating_continuously(run_a):
    """The probe reaches each replica behind its generation in flight and its weight load, so it is scored with the
    version just published; a replica that died meanwhile is not checked, its replacement is from the next step."""
    rows = read_jsonl(run_a / "metrics.jsonl")
    for r in rows:
        checked = [n for n in ("replica0", "replica1") if f"fleet/weight_sync/{n}/version" in r]
        assert len(checked) == r["fleet/weight_sync/replicas_checked"] >= 1
        for n in checked:
            assert r[f"fleet/weight_sync/{n}/version"] == r["step"]
            assert r[f"fleet/weight_sync/{n}/mean_abs_diff"] < 1e-4
    assert rows[-1]["fleet/weight_sync/replicas_checked"] == 2
    # the trainer does not wait for the gather: each publish's figures come with the next step (none at the first)
    assert not any(k.startswith("weight_sync/") and k.endswith("_s") for k in rows[0])
    for r in rows[1:]:
        assert r["weight_sync/bytes"] > 0
        # the actor's copy and put happen between the gather's sending and its answer, which precede admission
        assert r["weight_sync/copy_s"] + r["weight_sync/put_s"] <= r["weight_sync/gather_s"] \
            <= r["weight_sync/publish_s"]


@pytest.mark.slow
def test_partial_rollouts_record_each_tokens_version_and_a_resume_trains_each_prompt_once(run_b):
    out, stopped, resumed, pending = run_b
    assert stopped and not resumed
    # at the step-2 checkpoint, with k = 2, batches 2, 3 (the run's last) were drawn and not trained
    assert pending == [2, 3]
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(0 <= r["async/staleness"] <= 2 for r in rows)
    assert trained_ids(out) == list(range(4 * BATCH))  # 0 lost, 0 duplicated across the stop and the resume
    samples = read_jsonl(out / "samples.jsonl")
    assert samples
    for s in samples:  # the version of each response's first (and last, where it differs) token, within the bound
        newest = s.get("newest_version", s["weights_version"])
        assert s["weights_version"] <= newest <= s["step"] - 1
        assert s["step"] - 1 - s["weights_version"] <= 2
