"""env_metrics / val_env_metrics / env failures / conversation_text over hand-made rounds' meta (numbers derived in
comments)."""
from __future__ import annotations

import math

from reasonrl.data.sample import EnvOutcome, Sample, ToolOutcome
from reasonrl.envs.metrics import conversation_text, env_metrics, val_env_metrics
from reasonrl.trainer.metrics import validation_env_metrics
from reasonrl.trainer.streaming import mark_env_failures
from reasonrl.verifiers.base import VerifyResult

GEN = {"env": ["search", "search", "", "code_feedback"], "turns": [3, 1, 1, 2],
       "calls_per_tool": [{"search": 2}, {}, {}, {"python": 1}], "malformed_calls": [1, 0, 0, 2],
       "env_failed": ["", "", "", "environment 'code_feedback' step failed: timed out after 60 s"],
       "tool_seconds": [0.5, 0.0, 0.0, 1.5], "env_drift": [0, 1, -1, 0],
       "env_noncanonical": [1, 0, -1, 0],
       "env_reward": [1.0, 0.0, math.nan, 0.5]}


def test_env_metrics_of_a_round():
    right, wrong = VerifyResult(1.0, True, {}), VerifyResult(0.0, False, {})
    m = env_metrics(GEN, [right, right, wrong, wrong])
    assert (m["env/search/count"], m["env/none/count"], m["env/code_feedback/count"]) == (2.0, 1.0, 1.0)
    assert m["env/turns_mean"] == 7 / 4 and m["env/calls/search"] == 2.0 and m["env/calls/python"] == 1.0
    # rows 0 and 3 made a well-formed call (row 0 twice), rows 1 and 2 none: 2 of 4; row 3's malformed calls don't count
    assert m["env/call_rate"] == 2 / 4
    assert m["env/calls_per_trajectory"] == 3 / 4 and m["env/malformed_calls"] == 3.0 and m["env/failed"] == 1.0
    assert m["env/seconds"] == 2.0
    assert m["env/drift_checked"] == 3.0 and m["env/drift_rate"] == 1 / 3  # row 2 (plain) is unchecked
    assert m["env/noncanonical_rate"] == 1 / 3  # row 0 of the 3 checked: only its sampled token split differs
    assert m["env/reward_mean"] == 1.5 / 3  # rows 0, 1, 3 have a reward: (1 + 0 + 0.5) / 3
    # agreement (reward > 0.5 vs correct): row 0 yes (1.0, right), row 1 no (0.0, right), row 3 yes (0.5, wrong)
    assert m["env/reward_verifier_agreement"] == 2 / 3
    assert env_metrics({"turns": [1]}) == {}  # not an environment round


def test_failed_environments_become_failed_results_and_conversations_read_whole():
    samples = [Sample(group=0, response_ids=[], response_text="", rollout_log_probs=[], finish_reason="stop",
                      env=EnvOutcome(name, failed), result=VerifyResult(1.0, True, {}))
               for name, failed in zip(GEN["env"], GEN["env_failed"])]
    samples.append(Sample(group=0, response_ids=[], response_text="", rollout_log_probs=[], finish_reason="stop",
                          result=VerifyResult(1.0, True, {})))  # a plain rollout: no environment outcome
    results = [s.result for s in mark_env_failures(samples)]
    assert [r.failed for r in results] == [False, False, False, True, False]
    assert "timed out" in results[3].info["reason"] and results[3].info["environment"] == "code_feedback"
    text = conversation_text([{"role": "assistant", "content": "<tool_call>..."}, {"role": "tool", "content": "5"}])
    assert text == "[assistant]\n<tool_call>...\n[tool]\n5"


def test_feedback_metrics_count_first_failures_and_fixes():
    nan = math.nan
    gen = {"env": ["code_feedback"] * 5 + ["search"],
           "step_rewards": [[1.0],          # 0: first passed
                            [1 / 3, 1.0],   # 1: first failed, the second passed
                            [0.5],          # 2: first failed, the last program (turn 3) is untested
                            [],             # 3: no step: nothing the tests ran on
                            [nan, 1.0],     # 4: the first had no verdict (the tests could not run): not counted
                            [0.0]]}         # 5: another environment: not counted
    right, wrong = VerifyResult(1.0, True, {}), VerifyResult(0.0, False, {})
    m = env_metrics(gen)  # no verdicts: a later step that passed is the fix (row 1 only)
    # 5 code_feedback rows: first passed {0} = 1/5, first failed {1, 2} = 2/5, fixed {1} = 1/5, fix rate 1/2
    assert (m["env/code_feedback/first_passed"], m["env/code_feedback/first_failed"]) == (1 / 5, 2 / 5)
    assert (m["env/code_feedback/fixed"], m["env/code_feedback/fix_rate"]) == (1 / 5, 1 / 2)
    # with verdicts the final program decides: row 2's untested last program passed, row 1's verdict failed
    # (a sandbox failure there would fall back to the steps: row 1 fixed again)
    m = env_metrics(gen, [right, wrong, right, wrong, right, right])
    assert (m["env/code_feedback/fixed"], m["env/code_feedback/fix_rate"]) == (1 / 5, 1 / 2)
    m = env_metrics(gen, [right, VerifyResult.failure("x"), right, wrong, right, right])
    assert (m["env/code_feedback/fixed"], m["env/code_feedback/fix_rate"]) == (2 / 5, 1.0)
    # rows 1, 2 both fixed: 2/5; fix rate 2 of 2 first failures
    gen_no_cf = {"env": ["search"], "step_rewards": [[0.0]]}
    assert not any(k.startswith("env/code_feedback/") for k in env_metrics(gen_no_cf))
    assert "env/code_feedback/fixed" not in env_metrics({k: v for k, v in gen.items() if k != "step_rewards"})


def _held_out(calls, malformed, env, drift, tool_mask=(0,)):
    return Sample(group=0, response_ids=[1], response_text="", rollout_log_probs=[], finish_reason="stop",
                  tool_mask=list(tool_mask) if tool_mask is not None else None,
                  tools=ToolOutcome(malformed_calls=malformed, calls_per_tool=calls), env=EnvOutcome(env, drift=drift))


def test_validation_logs_the_held_out_call_and_drift_rates():
    samples = [_held_out({"search": 1}, 0, "search", 0),   # called once
               _held_out({"search": 2}, 1, "search", 1),   # called twice (one more malformed): counts once; drifted
               _held_out({}, 2, "search", 0),              # only malformed calls: not a call
               _held_out({"search": 1}, 0, "search", -1)]  # called; drift unchecked
    m = validation_env_metrics(samples)
    # 3 of 4 trajectories made a well-formed call; drift over the 3 checked rows (0, 1, 2): 1 of 3
    assert m == {"val/env/call_rate": 0.75, "val/env/drift_rate": 1 / 3, "val/env/drift_checked": 3.0}
    assert val_env_metrics({"env": ["search"] * 2, "calls_per_tool": [{}, {}], "malformed_calls": [3, 0],
                            "env_drift": [0, 0]})["val/env/call_rate"] == 0.0


def test_validation_without_an_environment_logs_no_env_keys():
    # a plain rollout (gsm8k): no tool mask, no outcomes
    plain = [Sample(group=0, response_ids=[1], response_text="", rollout_log_probs=[], finish_reason="stop")] * 2
    assert validation_env_metrics(plain) == {} and validation_env_metrics([]) == {}
    tools_only = [_held_out({"python": 1}, 0, "", -1)] * 2  # the tool loop with no environment on its rows
    assert validation_env_metrics(tools_only) == {}
    assert val_env_metrics({"turns": [1]}) == {}
