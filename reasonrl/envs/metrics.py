"""What the trainer does with a multi-turn round's environment outcomes (per-response columns named as the
``TOOL_META_KEYS`` of ``reasonrl.rollout.multiturn``): the step metrics (``env_metrics``; a validation pass's
``val_env_metrics``), a failed sample's result (``env_failure``: an environment that crashed or hung gives no
verdict) and the logged conversation (``conversation_text``). Plain functions over lists; no torch, no ray."""
from __future__ import annotations

import math
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence


ENV_COLUMNS = ("env", "turns", "calls_per_tool", "malformed_calls", "env_failed", "tool_seconds", "env_drift",
               "env_noncanonical", "env_reward", "step_rewards")
"""The per-response columns ``env_metrics`` reads."""


def _column(gen: Any, key: str) -> Optional[List[Any]]:
    try:
        return list(gen[key])
    except (KeyError, TypeError):
        return None


def env_metrics(gen: Any, results: Optional[Sequence[Any]] = None) -> Dict[str, float]:
    """``env/*`` metrics of one round: rows per environment, turns per trajectory, calls per tool, the share of
    trajectories with at least one well-formed call (``env/call_rate``; malformed ones are not counted), malformed
    calls, environment failures and seconds, over the drift-checked rows the boundary drift rate
    (``env/drift_rate``: the template's rendering differs at a turn boundary, in a tool turn or in text) and the
    non-canonical rate (``env/noncanonical_rate``: only the model's own token split differs, harmless), the
    environment's mean reward and, with the verifier ``results``, how often the environment's reward (> 0.5)
    agrees with the verifier's verdict."""
    envs = _column(gen, "env")
    if envs is None:
        return {}
    rows = max(1, len(envs))
    out: Dict[str, float] = {}
    for name, count in sorted(Counter(e or "none" for e in envs).items()):
        out[f"env/{name}/count"] = float(count)
    turns = _column(gen, "turns") or [0] * len(envs)
    out["env/turns_mean"] = sum(turns) / rows
    per_tool: Counter = Counter()
    called = 0
    for calls in _column(gen, "calls_per_tool") or []:
        per_tool.update(calls or {})
        called += bool(sum((calls or {}).values()))
    for name, count in sorted(per_tool.items()):
        out[f"env/calls/{name}"] = float(count)
    out["env/calls_per_trajectory"] = sum(per_tool.values()) / rows
    out["env/call_rate"] = called / rows
    out["env/malformed_calls"] = float(sum(_column(gen, "malformed_calls") or []))
    failed = [bool(f) for f in _column(gen, "env_failed") or []]
    out["env/failed"] = float(sum(failed))
    out["env/seconds"] = float(sum(_column(gen, "tool_seconds") or []))
    drift = [d for d in _column(gen, "env_drift") or [] if d in (0, 1)]
    out["env/drift_checked"] = float(len(drift))
    out["env/drift_rate"] = sum(drift) / len(drift) if drift else 0.0
    noncanonical = [d for d in _column(gen, "env_noncanonical") or [] if d in (0, 1)]
    out["env/noncanonical_rate"] = sum(noncanonical) / len(noncanonical) if noncanonical else 0.0
    rewards = [(i, r) for i, r in enumerate(_column(gen, "env_reward") or []) if r is not None and not math.isnan(r)]
    if rewards:
        out["env/reward_mean"] = sum(r for _, r in rewards) / len(rewards)
        if results is not None:
            agree = [bool(r > 0.5) == bool(results[i].correct) for i, r in rewards if not results[i].failed]
            if agree:
                out["env/reward_verifier_agreement"] = sum(agree) / len(agree)
    out.update(feedback_metrics(envs, _column(gen, "step_rewards"), results))
    return out


def val_env_metrics(gen: Any) -> Dict[str, float]:
    """Held-out environment metrics of a validation pass (``val/env/*``), over the same per-response columns as
    ``env_metrics``, only when some trajectory ran in an environment (a task without one logs none):
    ``val/env/call_rate``, the share of held-out trajectories with at least one well-formed call (malformed calls
    are not counted); ``val/env/drift_rate`` over the drift-checked ones (``val/env/drift_checked`` of them)."""
    envs = _column(gen, "env")
    if not envs or not any(envs):
        return {}
    step = env_metrics(gen)
    return {"val/env/call_rate": step["env/call_rate"], "val/env/drift_rate": step["env/drift_rate"],
            "val/env/drift_checked": step["env/drift_checked"]}


def feedback_metrics(envs: Sequence[str], step_rewards: Optional[Sequence[Any]],
                     results: Optional[Sequence[Any]] = None) -> Dict[str, float]:
    """Whether feedback helped, over the ``code_feedback`` trajectories. Each submission's verdict is the test
    harness's, carried by its step's reward (``step_rewards``, ``code_feedback.submission_passed``); nothing the
    program printed is read:

    - ``env/code_feedback/first_passed``, ``first_failed``: shares of the trajectories whose first step passed /
      failed its tests (the rest submitted nothing, or their first submission got no verdict);
    - ``fixed``: the share whose first submission failed and a later one passed: the verifier's verdict on the final
      program when ``results`` are given (that program may come in the last turn, which the environment never runs),
      else a later step that passed;
    - ``fix_rate``: ``fixed / first_failed`` (when any first submission failed)."""
    if step_rewards is None:
        return {}
    from .code_feedback import submission_passed

    picked = [i for i, e in enumerate(envs) if e == "code_feedback"]
    if not picked:
        return {}
    first_passed = first_failed = fixed = 0
    for i in picked:
        verdicts = [submission_passed(r) for r in step_rewards[i] or []]
        if not verdicts or verdicts[0] is None:
            continue
        if verdicts[0]:
            first_passed += 1
            continue
        first_failed += 1
        if results is not None and not results[i].failed:
            fixed += bool(results[i].correct)
        else:
            fixed += any(v for v in verdicts[1:])
    rows = len(picked)
    out = {"env/code_feedback/first_passed": first_passed / rows, "env/code_feedback/first_failed": first_failed / rows,
           "env/code_feedback/fixed": fixed / rows}
    if first_failed:
        out["env/code_feedback/fix_rate"] = fixed / first_failed
    return out


def env_failure(env: str, why: str) -> Any:
    """The result of a sample whose environment ``env`` failed (``why``: it raised or hung):
    ``VerifyResult.failure`` naming the environment, no verdict, left out of the advantages and the loss."""
    from reasonrl.verifiers.base import VerifyResult

    return VerifyResult.failure(f"environment failed: {why}"[:300], environment=env)


def conversation_text(conversation: Sequence[Dict[str, str]]) -> str:
    """A logged sample's whole conversation after the prompt, one ``[role]`` block per message."""
    return "\n".join(f"[{m.get('role', '?')}]\n{m.get('content', '')}" for m in conversation)
