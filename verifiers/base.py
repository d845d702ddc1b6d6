"""The verifier seam: a Verifier turns (response, ground_truth, extra fields) into a VerifyResult.

This module imports neither torch nor ray: verifiers run in small CPU worker processes.
A verifier never raises for a bad response; it returns ``VerifyResult.incorrect(reason)``.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Sequence, Type

from reasonrl.registry import Registry

ENTRY_POINT_GROUP = "reasonrl.verifiers"


@dataclass
class VerifyResult:
    """The verdict on one response."""

    score: float
    """The reward: 1.0 for a fully correct response, 0.0 for a wrong one; partial credit in between."""
    correct: bool
    """Whether the response counts as correct (for accuracy and pass@k)."""
    info: Dict[str, Any] = field(default_factory=dict)
    """Details: ``reason`` (why it scored as it did), ``extracted`` (the answer read from the response),
    ``error``, ``timed_out``, timing. Values must be picklable and JSON-friendly."""
    failed: bool = False
    """No verdict was reached: the call timed out, its worker died, the verifier raised or returned something that
    is not a finite score inside ``reward.score_range``, or the verifier's own backend failed (a sandbox that could
    not start). A failed sample is not a wrong answer: training leaves it out of its group's advantage and the loss
    and counts it (``reward/failed*``); evaluation counts it apart."""

    @classmethod
    def incorrect(cls, reason: str, **info: Any) -> "VerifyResult":
        """A verdict: the response is wrong (score 0) for ``reason``."""
        return cls(score=0.0, correct=False, info={"reason": reason, **info})

    @classmethod
    def failure(cls, reason: str, **info: Any) -> "VerifyResult":
        """No verdict (see ``failed``): the reason names what went wrong, never the response's fault."""
        return cls(score=0.0, correct=False, info={"reason": reason, **info}, failed=True)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def verdict_problem(result: Any, score_range: Sequence[float] = (0.0, 1.0)) -> Optional[str]:
    """Why ``result`` is not a usable verdict (a ``VerifyResult`` whose score is a finite number inside
    ``score_range``, bounds included), or None when it is one."""
    if not isinstance(result, VerifyResult):
        return f"returned {type(result).__name__}, not VerifyResult"
    try:
        score = float(result.score)
    except (TypeError, ValueError):
        return f"returned the score {result.score!r:.60}, not a number"
    if not math.isfinite(score):
        return f"returned the non-finite score {score}"
    low, high = score_range
    if not low <= score <= high:
        return f"returned the score {score:g}, outside reward.score_range [{low:g}, {high:g}]"
    return None


class Verifier:
    """Base class. Subclasses implement :meth:`verify`; options come in through ``__init__(**options)``."""

    name: str = "base"

    def __init__(self, **options: Any) -> None:
        self.options = options

    def verify(self, response: str, ground_truth: Any, **extra: Any) -> VerifyResult:  # pragma: no cover
        raise NotImplementedError

    def verify_many(self, response_list: list, ground_truth: Any, **extra: Any) -> list:
        """Verify several responses to the same prompt. Override to parse ``ground_truth`` once."""
        return [self.verify(r, ground_truth, **extra) for r in response_list]


def _check_verifier(name: str, cls: Any) -> Type[Verifier]:
    if not (isinstance(cls, type) and issubclass(cls, Verifier)):
        raise TypeError(f"@register_verifier({name!r}) needs a Verifier subclass, got {cls!r}")
    cls.name = name
    return cls


VERIFIERS = Registry("verifier",
                     entry_point_group=ENTRY_POINT_GROUP, builtins=(f"{__package__}.builtins",), check=_check_verifier)
"""Verifier classes by name: the built-in ones (``builtins.py``) and installed plugins' (the entry-point group)."""


def register_verifier(name: str) -> Callable[[Type[Verifier]], Type[Verifier]]:
    """Class decorator: ``@register_verifier("my_task")`` makes ``get_verifier("my_task")`` build it."""
    return VERIFIERS.register(name)


def available_verifiers() -> list:
    return VERIFIERS.names()


def get_verifier_class(name: str) -> Type[Verifier]:
    return VERIFIERS[name]


def get_verifier(name: str, **options: Any) -> Verifier:
    """Build the verifier registered as ``name`` with ``options``."""
    return get_verifier_class(name)(**options)
