"""env_metrics / with_env_failures / conversation_text over a hand-made round's meta (numbers derived in comments)."""
from __future__ import annotations

import math

from reasonrl.envs.metrics import conversation_text, env_metrics, with_env_failures
from reasonrl.verifiers.base import VerifyResult

GEN = {"env": ["search", "search", "", "code_feedback"], "turns": [3, 1, 1, 2],
       "calls_per_tool": [{"search": 2}, {}, {}, {"python": 1}], "malformed_calls": [1, 0, 0, 2],
       "env_failed": ["", "", "", "environment 'code_feedback' step failed: timed out after 60 s"],
       "tool_seconds": [0.5, 0.0, 0.0, 1.5], "env_drift": [0, 1, -1, 0],
       "env_reward": [1.0, 0.0, math.nan, 0.5]}


def test_env_metrics_of_a_round():
    right, wrong = VerifyResult(1.0, True, {}), VerifyResult(0.0, False, {})
    m = env_metrics(GEN, [right, right, wrong, wrong])
    assert (m["env/search/count"], m["env/none/count"], m["env/code_feedback/count"]) == (2.0, 1.0, 1.0)
    assert m["env/turns_mean"] == 7 / 4 and m["env/calls/search"] == 2.0 and m["env/calls/python"] == 1.0
    assert m["env/calls_per_trajectory"] == 3 / 4 and m["env/malformed_calls"] == 3.0 and m["env/failed"] == 1.0
    assert m["env/seconds"] == 2.0
    assert m["env/drift_checked"] == 3.0 and m["env/drift_rate"] == 1 / 3  # row 2 (plain) is unchecked
    assert m["env/reward_mean"] == 1.5 / 3  # rows 0, 1, 3 have a reward: (1 + 0 + 0.5) / 3
    # agreement (reward > 0.5 vs correct): row 0 yes (1.0, right), row 1 no (0.0, right), row 3 yes (0.5, wrong)
    assert m["env/reward_verifier_agreement"] == 2 / 3
    assert env_metrics({"turns": [1]}) == {}  # not an environment round


def test_failed_environments_become_failed_results_and_conversations_read_whole():
    results = with_env_failures(GEN, [VerifyResult(1.0, True, {})] * 4)
    assert [r.failed for r in results] == [False, False, False, True]
    assert "timed out" in results[3].info["reason"] and results[3].info["environment"] == "code_feedback"
    text = conversation_text([{"role": "assistant", "content": "<tool_call>..."}, {"role": "tool", "content": "5"}])
    assert text == "[assistant]\n<tool_call>...\n[tool]\n5"
