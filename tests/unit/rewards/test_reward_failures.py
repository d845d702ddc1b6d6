"""Responses without a verdict are failures, not wrong answers: left out of the advantages and the loss, counted, and a
step with too many stops the run; a run of steps that updated nothing stops too (reasonrl/trainer/failures.py)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from reasonrl.algorithms import compute_advantages
from reasonrl.data.sample import Round, Sample
from reasonrl.trainer.dynamic_sampling import informative_group_ids
from reasonrl.trainer.failures import (RunHaltedError, SkippedStepGuard, advantages_over_verdicts,
                                       check_failed_fraction, failure_metrics, verdict_mask, without_failed)
from reasonrl.verifiers import VerifyResult

from verifier_plugins import write_plugin  # tests/ is on sys.path (rootdir-less test modules)
from paths import REPO


def _results(scores, failed):
    return [VerifyResult.failure("timeout") if f else VerifyResult(float(s), s == 1, {"reason": "ok"})
            for s, f in zip(scores, failed)]


def _estimator(name):
    return lambda **kw: compute_advantages(name, **kw)


def test_failed_response_is_out_of_its_groups_baseline_grpo():
    # One group of four: scores 1, 0, (failed), 1. Over the three verdicts: mean 2/3, Bessel std
    # sqrt(((1/3)^2 + (2/3)^2 + (1/3)^2) / 2) = sqrt(1/3); A = (1 - 2/3) / sqrt(1/3) = 1/sqrt(3) = 0.57735 and
    # (0 - 2/3) / sqrt(1/3) = -2/sqrt(3) = -1.15470. The failed one gets 0. (Counting it as a 0 would give +-0.866.)
    results = _results([1, 0, 0, 1], [False, False, True, False])
    verdicts = verdict_mask(results)
    mask = torch.ones(4, 3)
    adv, ret = advantages_over_verdicts(_estimator("grpo"), verdicts, scores=torch.tensor([1.0, 0.0, 0.0, 1.0]),
                                        mask=mask, group_index=torch.zeros(4, dtype=torch.long), norm_by_std=True,
                                        eps=0.0)
    expected = torch.tensor([1 / math.sqrt(3), -2 / math.sqrt(3), 0.0, 1 / math.sqrt(3)])
    assert torch.allclose(adv[:, 0], expected, atol=1e-5) and torch.allclose(adv, adv[:, :1].expand(4, 3))
    assert torch.equal(ret[2], torch.zeros(3))


def test_failed_response_is_out_of_its_groups_baseline_rloo_and_other_groups_untouched():
    # Group 0: 1, 0, (failed), 1 -> leave-one-out over the 3 verdicts: 1 - (0 + 1)/2 = 0.5, 0 - (1 + 1)/2 = -1.
    # Group 1: 0, 1 (no failure) -> 0 - 1 = -1, 1 - 0 = 1.
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    verdicts = torch.tensor([True, True, False, True, True, True])
    adv, _ = advantages_over_verdicts(_estimator("rloo"), verdicts, scores=scores, mask=torch.ones(6, 2),
                                      group_index=torch.tensor([0, 0, 0, 0, 1, 1]))
    assert torch.allclose(adv[:, 0], torch.tensor([0.5, -1.0, 0.0, 0.5, -1.0, 1.0]))


def test_all_verdicts_is_the_estimator_itself_and_none_is_zero():
    scores, mask, groups = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.ones(4, 2), torch.tensor([0, 0, 1, 1])
    direct = compute_advantages("grpo", scores=scores, mask=mask, group_index=groups)
    wrapped = advantages_over_verdicts(_estimator("grpo"), torch.ones(4, dtype=torch.bool), scores=scores,
                                       mask=mask, group_index=groups)
    assert all(torch.equal(a, b) for a, b in zip(direct, wrapped))
    adv, ret = advantages_over_verdicts(_estimator("grpo"), torch.zeros(4, dtype=torch.bool), scores=scores,
                                        mask=mask, group_index=groups)
    assert not adv.any() and not ret.any()


def test_loss_mask_drops_failed_rows_and_metrics_count_them_per_verifier():
    results = _results([1, 0, 0, 0], [False, True, True, False])
    verdicts = verdict_mask(results)
    assert verdicts.tolist() == [True, False, False, True]
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    assert without_failed(mask, verdicts).tolist() == [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]
    metrics = failure_metrics(results, ["math", "code", "math", "code"])
    assert metrics == {"reward/failed_count": 2.0, "reward/failed_frac": 0.5, "reward/code/failed": 1.0,
                       "reward/math/failed": 1.0}


def test_too_many_failures_stop_the_run_naming_verifiers_and_reasons():
    results = _results([0, 0, 0, 1], [True, True, True, False])
    results[2] = VerifyResult.failure("verifier 'judge' returned the non-finite score nan")
    verifiers = ["math", "math", "judge", "math"]
    check_failed_fraction(results, verifiers, max_fraction=0.75, step=3)  # 3 of 4 = 0.75: not more than allowed
    with pytest.raises(RunHaltedError) as err:
        check_failed_fraction(results, verifiers, max_fraction=0.5, step=3)
    message = str(err.value)
    assert message.startswith("step 3: 3 of 4 responses got no verdict")
    assert "judge: 1 (verifier 'judge' returned the non-finite score nan (x1))" in message
    assert "math: 2 (timeout (x2))" in message and "reward.max_failed_fraction" in message


def test_a_run_of_skipped_optimizer_steps_stops():
    guard = SkippedStepGuard(limit=2)
    skipped = {"actor/optimizer_steps": 0.0, "actor/skipped_optimizer_steps": 2.0}
    guard.observe(skipped, step=1)
    guard.observe({"actor/optimizer_steps": 1.0, "actor/skipped_optimizer_steps": 1.0}, step=2)  # one step taken
    guard.observe(skipped, step=3)
    with pytest.raises(RunHaltedError, match="step 4: every optimizer step of the last 2 steps was skipped"):
        guard.observe(skipped, step=4)
    never = SkippedStepGuard(limit=0)
    for step in range(10):
        never.observe(skipped, step)


def test_dynamic_sampling_judges_groups_by_their_verdicts_only():
    # group 0: 1, (failed) -> one verdict only: not informative; group 1: 0, 1 -> informative;
    # group 2: (failed), (failed) -> nothing; group 3: 0, 0 -> all equal.
    results = _results([1, 0, 0, 1, 0, 0, 0, 0], [False, True, False, False, True, True, False, False])
    samples = [Sample(group=i // 2, response_ids=[], response_text="", rollout_log_probs=[], finish_reason="stop",
                      result=r) for i, r in enumerate(results)]
    assert informative_group_ids(Round(["p0", "p1", "p2", "p3"], samples)) == [1]


HOSTILE = textwrap.dedent('''
    """A verifier plugin whose answer the data row chooses (extra_info.mode)."""
    from reasonrl.verifiers import Verifier, VerifyResult

    class HostileVerifier(Verifier):
        def verify(self, response, ground_truth, mode="ok", **extra):
            if mode == "nan":
                return VerifyResult(float("nan"), True, {"reason": "nan"})
            if mode == "inf":
                return VerifyResult(float("inf"), True, {"reason": "inf"})
            if mode == "big":
                return VerifyResult(100.0, True, {"reason": "out of range"})
            if mode == "nonresult":
                return 1.0
            return VerifyResult(0.0, False, {"reason": "wrong"})
''')


@pytest.mark.slow
def test_real_loop_failures_remax_baseline_and_adaptive_kl(tmp_path, tiny_policy):
    """One real run (ReMax, KL loss with the adaptive controller, a plugin verifier whose answer each row chooses):

    - step 1: one honest prompt and three whose verifier answers NaN, inf and 100, 2 responses each: 6 failures are
      recorded (and the greedy baselines of those prompts fail too), reward and accuracy are over the 2 verdicts
      (0.0, not 1.0), and the update is finite;
    - step 2: four honest prompts. At step 1 the actor was the reference, so its measured KL was ~0 and the
      controller's error clipped to -0.2: kl_coef(2) = 0.05 * (1 - 0.2 * 8 responses / horizon 8) = 0.04, and the
      checkpoint of step 2 holds 0.04 * 0.8 = 0.032 (KL still far below the target 1.0);
    - step 3: four prompts whose verifier returns a float: no verdict at all, and the run stops with exit 5 naming it.

    The verdicts are the plugin's, whatever the text, so the policy is conftest's ``tiny_policy`` (a random 2-layer
    Llama with SmolLM2's tokenizer).
    """
    plugin = write_plugin(tmp_path / "plugin", "hostile_verifier", HOSTILE, "hostile", "HostileVerifier")
    row = {"data_source": "hostile", "prompt": [{"role": "user", "content": "What is 2+2?"}], "ability": "math",
           "reward_model": {"style": "rule", "ground_truth": "4"}}
    modes = ["ok", "nan", "inf", "big"] + ["ok"] * 4 + ["nonresult"] * 4
    data = tmp_path / "hostile.parquet"
    pq.write_table(pa.Table.from_pylist([dict(row, extra_info={"mode": m, "index": i}) for i, m in
                                         enumerate(modes)]), data)
    out = tmp_path / "run"
    args = ["task=gsm8k", "algorithm=remax", "algorithm.use_kl_loss=true", "algorithm.kl_coef=0.05",
            "algorithm.kl_ctrl=adaptive", "algorithm.kl_target=1.0", "algorithm.kl_horizon=8",
            "reward.verifier=hostile", f"model.path={tiny_policy}", f"data.train_files=[{data}]", "data.shuffle=false",
            "rollout.engine=hf",
            "data.train_batch_size=4", "rollout.n=2", "rollout.max_new_tokens=8", "reward.workers=1",
            "reward.max_failed_fraction=0.8", "actor.micro_batch_size_per_worker=8", "trainer.total_steps=3",
            "trainer.save_every=2", "trainer.logger=[jsonl]", f"trainer.output_dir={out}"]
    env = dict(__import__("os").environ, PYTHONPATH=f"{plugin}:{REPO}")
    proc = subprocess.run([sys.executable, "-m", "reasonrl.train", *args], capture_output=True, text=True,
                          timeout=900, env=env)
    assert proc.returncode == 5, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "step 3: 8 of 8 responses got no verdict" in proc.stderr and "hostile: 8" in proc.stderr
    assert "returned float, not VerifyResult" in proc.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows] == [1, 2]
    step1, step2 = rows
    assert step1["reward/failed_count"] == 6 and step1["reward/failed_frac"] == 0.75
    assert step1["reward/hostile/failed"] == 6 and step1["reward/hostile/count"] == 2
    assert step1["reward/mean"] == 0.0 and step1["reward/accuracy"] == 0.0  # the honest verdicts, not 1.0
    assert step2["reward/failed_count"] == 0 and step2["reward/hostile/count"] == 8
    for r in rows:
        assert r["actor/optimizer_steps"] >= 1 and r["actor/skipped_optimizer_steps"] == 0
        assert math.isfinite(r["actor/grad_norm"]) and math.isfinite(r["actor/pg_loss"])
        assert r["timing_s/baseline_rollout"] > 0 and r["remax/baseline_reward_mean"] == 0.0
        assert r["actor/kl"] < 0.8  # far below the target: the controller's error clips at -0.2
    assert step1["actor/kl_coef"] == pytest.approx(0.05) and step2["actor/kl_coef"] == pytest.approx(0.04)
    state = json.loads((out / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    assert state["kl_ctrl"]["kl_coef"] == pytest.approx(0.032)
