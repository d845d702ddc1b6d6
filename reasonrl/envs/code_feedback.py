"""The ``code_feedback`` environment: MBPP in turns (``task=code_feedback``). The model submits a fenced ```python
program; the environment runs the row's tests on it in the sandbox (the code verifier's harness,
``reasonrl.verifiers.code``) and answers with the failures, so the model may fix its code and submit again. Reward:
the fraction of tests the latest submission passes, 1.0 exactly when the harness says every test passed (the
trajectory's ``env_reward`` is the final submission's; each step's reward is in its ``step_rewards``, which the
feedback metrics read: never the observation's text, which quotes what the program printed); all passing ends the
trajectory. The verifier then scores the response's last program the same way.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

from .base import EnvContext, Environment, StepResult, ToolCall, check_arguments
from .registry import register_environment

MAX_FAILURES_SHOWN = 3
ALL_PASSED = "All {total} tests passed."
"""The feedback of a submission that passed every test."""
NOT_RUN = "Error: the tests could not run"
"""The start of the observation when the sandbox gave no verdict (neither a pass nor a failure)."""
CODE_SCHEMA = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}


def code_runner(context: EnvContext) -> Any:
    """The code verifier the loop's environments share (sandbox and memory limit from the ``tool`` section)."""
    def build():
        from reasonrl.verifiers import get_verifier

        cfg = context.tool_cfg
        return get_verifier("code", sandbox=getattr(cfg, "sandbox", "auto"), score_mode="fraction",
                            timeout_s=10.0, memory_mb=max(256, int(getattr(cfg, "memory_mb", 512))))

    return context.shared("code_runner", build)


def feedback(result: Any) -> str:
    """The observation for one verified submission: how many tests passed and the first failures."""
    info = result.info
    total, passed = info.get("total", 0), info.get("passed", 0)
    if result.correct:
        return ALL_PASSED.format(total=total)
    lines = [f"{passed} of {total} tests passed." if "passed" in info else f"Not run: {info.get('reason', '?')}"]
    if info.get("load_error"):
        lines.append(f"The program failed to load: {str(info['load_error'])[:300]}")
    for failure in (info.get("failed") or [])[:MAX_FAILURES_SHOWN]:
        lines.append(f"FAILED {str(failure.get('test', ''))[:200]}: {str(failure.get('error', ''))[:200]}")
    if "error" in info and "passed" not in info:
        lines.append(str(info["error"])[:300])
    return "\n".join(lines)


def submission_passed(reward: float) -> Optional[bool]:
    """The harness's verdict on one submission, from its step's reward (``step_rewards``): True (every test passed:
    1.0), False (a failure: less), None (no verdict: the tests could not run, or a bad call; NaN)."""
    if reward is None or math.isnan(reward):
        return None
    return reward >= 1.0


@register_environment("code_feedback")
class CodeFeedbackEnvironment(Environment):
    """Each ```python block the model closes is a submission, tested against the row's ground truth."""

    parser = "fenced_python"

    def __init__(self, context: EnvContext = None) -> None:
        super().__init__(context)
        self.runner = code_runner(self.context)

    def tools(self) -> List[Dict[str, Any]]:
        return [{"type": "function", "function": {"name": "python", "description": "Submit a program; the tests "
                 "run on it and the failures are shown.", "parameters": CODE_SCHEMA}}]

    def step(self, call: ToolCall) -> StepResult:
        why = check_arguments(CODE_SCHEMA, call.arguments) if call.name == "python" else f"unknown tool {call.name!r}"
        if why is not None:
            return StepResult(f"Error: {why}", error=True)
        truth = (self.row.get("reward_model") or {}).get("ground_truth")
        result = self.runner.verify(f"```python\n{call.arguments['code']}\n```", truth)
        if result.failed:  # the sandbox could not run: no verdict to give
            return StepResult(f"{NOT_RUN} ({result.info.get('reason', '?')})", error=True)
        return StepResult(feedback(result), reward=1.0 if result.correct else float(result.score),
                          done=bool(result.correct), error=not result.correct)
