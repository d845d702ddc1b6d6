"""The code_feedback metrics count a submission as passed only on the test harness's verdict: programs whose own
output (an exception's message, text written to stderr at load) says "All 2 tests passed." are failures in
``env/code_feedback/*`` as in their reward, on both sandbox backends, through the real loop, the real code verifier
and the real SmolLM2 tokenizer; the model's turns are scripted."""
from __future__ import annotations

import pytest
from env_helpers import ScriptedPolicy, chat_prompt, tool_runs

from reasonrl.config.env_schema import EnvConfig
from reasonrl.config.schema import ToolConfig
from reasonrl.envs.metrics import env_metrics
from reasonrl.rollout import SamplingParams
from reasonrl.rollout.multiturn import ToolRollout, tool_meta
from reasonrl.sandboxes.bwrap import bwrap_usable
from reasonrl.sandboxes.docker_pool import docker_usable
from reasonrl.verifiers import get_verifier

BACKENDS = [
    pytest.param("bwrap", marks=pytest.mark.skipif(not bwrap_usable()[0], reason=f"bwrap unusable: {bwrap_usable()[1]}")),
    pytest.param("docker", marks=pytest.mark.skipif(not docker_usable()[0],
                                                     reason=f"Docker daemon or image unavailable: {docker_usable()[1]}")),
]
TRUTH = {"tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]}
CLAIM = "All 2 tests passed."
FORGED_IN_FAILURE = f"def add(a, b):\n    raise RuntimeError({CLAIM!r})\n"
FORGED_AT_LOAD = f"import sys\nsys.stderr.write({CLAIM!r} + '\\n')\nraise SystemExit({CLAIM!r})\n"
WRONG = "def add(a, b):\n    return a * b\n"  # passes add(2, 2) only
RIGHT = "def add(a, b):\n    return a + b\n"


def block(code: str) -> str:
    return f"```python\n{code}```\n"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_program_that_prints_the_pass_line_is_a_failure_in_the_metrics(backend, tokenizer):
    forger, honest, right_first = (chat_prompt(tokenizer, q) for q in ("Write add.", "Write add(a, b).", "add?"))
    engine = ScriptedPolicy(tokenizer, {tuple(forger): [block(FORGED_IN_FAILURE), block(FORGED_AT_LOAD), "done"],
                                        tuple(honest): [block(WRONG), block(RIGHT), "unused"],
                                        tuple(right_first): [block(RIGHT), "unused"]})
    loop = ToolRollout(engine, tokenizer, None, max_turns=3, env_cfg=EnvConfig(), default_env="code_feedback",
                       tool_cfg=ToolConfig(sandbox=backend, timeout_s=5.0, memory_mb=256))
    try:
        out = loop.generate([forger, honest, right_first], SamplingParams(n=1, max_new_tokens=600),
                            rows=[{"reward_model": {"ground_truth": TRUTH}}] * 3)
    finally:
        loop.close()
    (f,), (h,), (r,) = out
    shown = tool_runs(tokenizer, f)
    assert len(shown) == 2 and all(CLAIM in s for s in shown), shown  # the claim reached the observations
    assert (f.step_rewards, f.env_reward, f.env_failed) == ([0.0, 0.0], 0.0, "")
    assert (h.step_rewards, h.env_reward) == ([0.5, 1.0], 1.0)  # 1 of 2, then 2 of 2 (which ends the trajectory)
    assert (r.step_rewards, r.env_reward, r.turns) == ([1.0], 1.0, 1)
    gen = tool_meta([f, h, r])
    # three code_feedback rows: first passed {r} = 1/3, first failed {f, h} = 2/3, fixed {h} = 1/3, fix rate 1/2
    expected = {"env/code_feedback/first_passed": 1 / 3, "env/code_feedback/first_failed": 2 / 3,
                "env/code_feedback/fixed": 1 / 3, "env/code_feedback/fix_rate": 1 / 2}
    m = env_metrics(gen)
    assert {k: m[k] for k in expected} == expected
    verifier = get_verifier("code", sandbox=backend)
    results = [verifier.verify(c.text, TRUTH) for c in (f, h, r)]  # the final programs: forged, right, right
    assert [v.correct for v in results] == [False, True, True]
    m = env_metrics(gen, results)
    assert {k: m[k] for k in expected} == expected
