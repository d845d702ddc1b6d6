"""What the viewer reads from a sample-log row (``reasonrl/logging/sample_log.py`` has its fields): its verdict and
length, and the helpers of the samples API (numbers from the query, strings as small integers). The index is
``sample_index``, the filters ``sample_query``, the same prompt across steps ``prompt_steps``."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

VERDICTS = ("correct", "wrong", "failed")


def verdict_of(row: Mapping[str, Any]) -> str:
    """``failed`` (no verdict), ``correct`` or ``wrong``; a row without ``correct`` is correct when its reward > 0."""
    if row.get("failed"):
        return "failed"
    correct = row.get("correct")
    if correct is None:
        reward = row.get("reward")
        correct = isinstance(reward, (int, float)) and reward > 0
    return "correct" if correct else "wrong"


def length_of(row: Mapping[str, Any]) -> int:
    tokens = row.get("response_tokens")
    return int(tokens) if isinstance(tokens, int) else len(row.get("response") or "")


def number_param(params: Mapping[str, str], key: str) -> Optional[float]:
    """``params[key]`` as a number (None when absent or empty); ValueError naming the parameter otherwise."""
    value = params.get(key)
    if value in (None, ""):
        return None
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"parameter {key}={value!r} is not a number") from None


class Codes:
    """Strings as small integers (the index keeps one per row)."""

    def __init__(self) -> None:
        self.names: List[str] = []
        self._code: Dict[str, int] = {}

    def known(self) -> Dict[str, int]:
        return self._code

    def code(self, name: Any) -> int:
        name = "" if name is None else str(name)
        if name not in self._code:
            self._code[name] = len(self.names)
            self.names.append(name)
        return self._code[name]
