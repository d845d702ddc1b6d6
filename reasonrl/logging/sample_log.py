"""The sample log, ``<run_dir>/samples.jsonl`` (``trainer.log_samples_every``): one JSON object per logged response.

Its fields, in one place (``RunLogger.log_samples`` adds ``step``; ``python -m reasonrl.view`` reads them):

    step, prompt, response, reward, verifier, failed, reason, correct, data_source, ground_truth, level,
    response_tokens, finish_reason, and conversation (a multi-turn rollout's turns after the prompt, tool turns
    included, one ``[role]`` block per message).

Logs written before ``correct`` .. ``finish_reason`` existed lack them; readers treat them as optional.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

SAMPLE_LOG = "samples.jsonl"
"""The sample log's file name in the run directory."""
VAL_SAMPLE_LOG = "val_samples.jsonl"
"""The held-out responses' log (``trainer.log_val_samples``): the same fields, ``step`` the validation's."""


def sample_log_row(prompt: str, response: str, reward: float, verifier: str, failed: bool, reason: str,
                   correct: Optional[bool], row: Dict[str, Any], response_tokens: int, finish_reason: str,
                   conversation: Optional[str] = None, level: Optional[str] = None,
                   weights_version: Optional[int] = None, newest_version: Optional[int] = None) -> Dict[str, Any]:
    """One response's sample-log row; ``row`` is its dataset row (``data_source``, ``reward_model.ground_truth``).
    ``weights_version``: the weights that generated it, where the mode records them (``Sample.weights_version``:
    async rollout workers and fleet replicas; a partial rollout's oldest); ``newest_version``: a partial rollout's
    newest, logged only when it differs (its tokens span both)."""
    ground_truth = (row.get("reward_model") or {}).get("ground_truth")
    out = {"prompt": prompt, "response": response, "reward": reward, "verifier": verifier, "failed": bool(failed),
           "reason": reason, "correct": None if correct is None else bool(correct),
           "data_source": row.get("data_source"), "ground_truth": ground_truth, "level": level,
           "response_tokens": int(response_tokens), "finish_reason": finish_reason}
    if conversation:
        out["conversation"] = conversation
    if weights_version is not None:
        out["weights_version"] = int(weights_version)
        if newest_version is not None and newest_version != weights_version:
            out["newest_version"] = int(newest_version)
    return out
