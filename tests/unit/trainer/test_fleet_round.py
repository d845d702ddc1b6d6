"""The fleet's round bookkeeping (``replicas.FleetRound``: the router and the ledger, no Ray): assignment, a lost
replica's prompts issued again once, late and second answers dropped. Expectations derived by hand."""
from __future__ import annotations

from helpers import round_of
from reasonrl.fleet.ledger import DONE, ISSUED, PENDING, Ledger
from reasonrl.trainer.fleet_journal import drop_rounds_from, ledger_summary


def test_prompts_alternate_by_least_outstanding_requests_and_carry_round_ids(tmp_path):
    rnd, router, ledger = round_of(tmp_path)
    # k0: tie -> replica0 (added first); k1: replica0 has 1 -> replica1; k2: 1 each, tie -> replica0; k3 -> replica1
    assert rnd.assign(range(4)) == {"replica0": [(0, 1), (2, 1)], "replica1": [(1, 1), (3, 1)]}
    assert [ledger.state(i).replica for i in (12, 13, 14, 15)] == ["replica0", "replica1", "replica0", "replica1"]
    assert router.outstanding("replica0") == 2 and ledger.counts()[ISSUED] == 4


def test_a_lost_replicas_prompts_go_once_to_the_live_one_and_late_answers_are_dropped(tmp_path):
    rnd, router, ledger = round_of(tmp_path)
    first = rnd.assign(range(4))
    assert rnd.lost("replica1", "died: SIGKILL") == [1, 3]
    assert router.replicas() == ["replica0"] and [ledger.state(i).state for i in (13, 15)] == [PENDING, PENDING]
    assert rnd.assign([1, 3]) == {"replica0": [(1, 2), (3, 2)]}  # the only live replica, attempt 2 each
    assert rnd.answered("replica1", first["replica1"], {1: 2, 3: 2}) == []  # the dead one's late answer
    assert rnd.answered("replica0", first["replica0"] + [(1, 2), (3, 2)], {0: 2, 1: 2, 2: 2, 3: 2}) == [0, 2, 1, 3]
    assert rnd.answered("replica0", [(1, 2)], {1: 2}) == []  # a second answer
    assert ledger.counts()[DONE] == 4 and rnd.reissued == [1, 3]
    assert ledger.state(13).payload == {"replica": "replica0", "samples": 2} and ledger.state(13).attempt == 2
    assert router.outstanding("replica0") == 0
    ledger.close()
    assert ledger_summary(tmp_path) == {"pending": 0, "issued": 0, "done": 4, "failed": 0, "trained": 0}


def test_a_start_drops_the_journals_of_rounds_not_yet_trained_in_the_runs_history(tmp_path):
    """A run killed before its first checkpoint left rounds 0-2 (one trained): a restart at step 1 keeps round 0 only;
    at step 0 nothing is kept."""
    for step in range(3):
        Ledger.open(tmp_path / f"round_{step:06d}.jsonl", step, [step * 2, step * 2 + 1]).close()
    assert drop_rounds_from(tmp_path, 1) == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["round_000000.jsonl"]
    assert drop_rounds_from(tmp_path, 0) == [0] and not list(tmp_path.iterdir())


def sample(group, failed, reason="verifier timed out after 5 s"):
    from reasonrl.data.sample import Sample
    from reasonrl.verifiers import VerifyResult

    result = VerifyResult.failure(reason) if failed else VerifyResult.incorrect("wrong answer")
    return Sample(group=group, response_ids=[1], response_text="x", rollout_log_probs=[], finish_reason="stop",
                  verifier="math", result=result)


def test_a_prompt_whose_every_sample_failed_verification_is_dropped_with_its_reason(tmp_path):
    """Round 3 of 4 prompts x 2 samples: prompt 1's two samples failed verification (out of the loss: not trained);
    prompt 2 has one failed sample and one verdict (trained on the other). At publish prompt 13 is dropped with the
    reason, 12, 14, 15 trained; the audit reports 13 dropped, not lost."""
    from reasonrl.fleet.audit import audit
    from reasonrl.trainer.fleet_journal import mark_trained, untrainable_groups

    (tmp_path / "run").mkdir()
    rnd, _, ledger = round_of(tmp_path / "run")
    issued = rnd.assign(range(4))
    for name, pairs in issued.items():
        rnd.answered(name, pairs, {k: 2 for k, _ in pairs})
    ledger.close()
    samples = [sample(0, False), sample(0, False), sample(1, True), sample(1, True, "worker died"),
               sample(2, True), sample(2, False), sample(3, False), sample(3, False)]
    dropped = untrainable_groups(samples)
    assert dropped == {1: "every sample failed verification (math: verifier timed out after 5 s)"}
    mark_trained((ledger.path, dropped))
    assert ledger_summary(tmp_path / "run") == {"pending": 0, "issued": 0, "done": 0, "failed": 1, "trained": 3}
    (tmp_path / "reference").mkdir()
    ref, _, ref_ledger = round_of(tmp_path / "reference")
    for name, pairs in ref.assign(range(4)).items():
        ref.answered(name, pairs, {k: 2 for k, _ in pairs})
    ref_ledger.close()
    mark_trained((ref_ledger.path, {}))
    result = audit(tmp_path / "reference", tmp_path / "run")
    assert result.dropped == {13: ["every sample failed verification (math: verifier timed out after 5 s)"]}
    assert result.lost == {} and result.duplicated == {}
    assert result.counts()["dropped"] == 1 and result.counts()["trained"] == 3 and result.counts()["expected"] == 4


def test_a_raised_calls_prompts_go_again_off_the_replica_and_a_poison_prompt_is_done_with_its_failures(tmp_path):
    """replica1's call of positions 1 and 3 raised (the replica lives): both revoked, issued again (attempt 2) on
    replica0, which ``avoid`` keeps them off replica1 for although their group is sticky there; the late answer of
    the raised attempt changes nothing; position 1 then answered with its failed samples (poison) is done."""
    rnd, router, ledger = round_of(tmp_path)
    first = rnd.assign(range(4))
    assert rnd.retry("replica1", first["replica1"], "raised: FaultRaised") == [1, 3]
    assert router.outstanding("replica1") == 0 and [ledger.state(i).state for i in (13, 15)] == [PENDING, PENDING]
    assert rnd.assign([1, 3], avoid={13: "replica1", 15: "replica1"}) == {"replica0": [(1, 2), (3, 2)]}
    assert rnd.retry("replica1", first["replica1"], "raised again") == []  # not in flight there any more
    assert rnd.answered("replica0", [(1, 2)], {1: 2}) == [1] and ledger.state(13).state == DONE
    assert rnd.reissued == [1, 3]
    # without avoid the group is sticky to the replica it was first on
    rnd2, _, _ = round_of(tmp_path / "b")
    again = rnd2.assign(range(4))
    rnd2.retry("replica1", again["replica1"], "raised")
    assert rnd2.assign([1]) == {"replica1": [(1, 2)]}


def test_a_poison_prompts_samples_are_recorded_failures_dropped_with_the_poison_reason():
    """``poison_samples``: n failed samples of the prompt (no response, masked, not scored), the prompt's verifier;
    ``untrainable_groups`` drops the group with the poison reason as it stands (not as a verification failure)."""
    from reasonrl.config.schema import RewardConfig
    from reasonrl.data.prompts import Prompt
    from reasonrl.trainer.fleet_journal import untrainable_groups
    from reasonrl.trainer.streaming import poison_samples

    reason = "poison prompt: its generate call raised alone on replica0, replica1: FaultRaised: fault point: raise"
    prompt = Prompt(row={"prompt": "1+1", "answer": "2", "verifier": "math"}, token_ids=[5, 6])
    bad = poison_samples(1, 2, prompt, reason, version=3, reward_cfg=RewardConfig())
    assert [(s.group, s.response_ids, s.weights_version, s.result.failed) for s in bad] == [(1, [], 3, True)] * 2
    assert bad[0].result.score == 0.0 and bad[0].verifier == "math" and bad[0].prompt is prompt
    assert untrainable_groups([sample(0, False), sample(0, False)] + bad) == {1: reason}
