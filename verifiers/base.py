"""The verifier seam: a Verifier turns (response, ground_truth, extra fields) into a VerifyResult.

This module imports neither torch nor ray: verifiers run in small CPU worker processes.
A verifier never raises for a bad response; it returns ``VerifyResult.incorrect(reason)``.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Dict, Optional, Sequence, Type

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


_REGISTRY: Dict[str, Type[Verifier]] = {}
_BUILTINS_LOADED = False
_ENTRY_POINTS_LOADED = False


def register_verifier(name: str) -> Callable[[Type[Verifier]], Type[Verifier]]:
    """Class decorator: ``@register_verifier("my_task")`` makes ``get_verifier("my_task")`` build it."""

    def decorate(cls: Type[Verifier]) -> Type[Verifier]:
        if not (isinstance(cls, type) and issubclass(cls, Verifier)):
            raise TypeError(f"@register_verifier({name!r}) needs a Verifier subclass, got {cls!r}")
        existing = _REGISTRY.get(name)
        if existing is not None and existing is not cls and existing.__qualname__ != cls.__qualname__:
            raise ValueError(f"verifier name {name!r} is already registered by {existing.__module__}.{existing.__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    _BUILTINS_LOADED = True
    from . import builtins  # noqa: F401  (imports the built-in verifier modules, which register themselves)


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _REGISTRY:
            continue
        obj = ep.load()  # a module (registering on import) or a Verifier class
        if isinstance(obj, type) and issubclass(obj, Verifier) and ep.name not in _REGISTRY:
            register_verifier(ep.name)(obj)


def available_verifiers() -> list:
    _load_builtins()
    _load_entry_points()
    return sorted(_REGISTRY)


def get_verifier_class(name: str) -> Type[Verifier]:
    _load_builtins()
    if name not in _REGISTRY:
        _load_entry_points()
    if name not in _REGISTRY:
        raise KeyError(f"unknown verifier {name!r}; known: {', '.join(sorted(_REGISTRY)) or '(none)'}. "
                       f"Third-party verifiers register through the {ENTRY_POINT_GROUP!r} entry-point group.")
    return _REGISTRY[name]


def get_verifier(name: str, **options: Any) -> Verifier:
    """Build the verifier registered as ``name`` with ``options``."""
    return get_verifier_class(name)(**options)
