"""Answers that describe a set of real numbers: intervals (``(a, b)``, ``[a, b)``, unions with ``\\cup``) and
inequalities in one variable (``a < x < b``, ``x \\le 2``, ``x < 2 \\text{ or } x > 3``, ``x \\ne 1``).

``solution_set`` turns either form into a list of intervals, so that ``(1, 5)`` and ``1 < x < 5`` compare
equal, while a different end point, or an open end against a closed one, does not. math-verify alone reads
``x < 2 \\text{ or } x > 3`` as the *list* of two relations and ``(1, 5)`` against ``1 < x < 5`` (a relation
predicted for a set) as unequal, which is why this exists. Parsing itself is math-verify's (passed in).
"""
from __future__ import annotations

import re
from typing import Callable, List, Optional, Tuple

INEQUALITY = re.compile(r"<|>|≤|≥|≠|\\(?:le|ge|leq|geq|leqslant|geqslant|lt|gt|ne|neq)(?![a-zA-Z])")
"""An inequality sign: only answers holding one are read as solution sets here."""
_OR = re.compile(r"\s*(?:\bor\b|\\lor(?![a-zA-Z])|\\vee(?![a-zA-Z])|\\text\{\s*or\s*\})\s*")
_AND = re.compile(r"\s*(?:\band\b|\\land(?![a-zA-Z])|\\wedge(?![a-zA-Z])|\\text\{\s*and\s*\})\s*")
_MEMBERSHIP = re.compile(r"^[a-zA-Z]\s*\\in\s*")
_MAX_CHARS = 300
"""Longer answers are not read as solution sets (bounded sympy work)."""
_MAX_PIECES = 8
"""Most inequalities one answer may join."""

Interval = Tuple[object, object, bool, bool]
"""``(start, end, left_open, right_open)`` with sympy end points (``-oo``/``oo`` for unbounded ends)."""


def _intervals(sympy_set) -> Optional[List[Interval]]:
    """The disjoint intervals of a sympy set, sorted; None when it holds anything but intervals."""
    import sympy

    pieces, stack = [], [sympy_set]
    while stack:  # math-verify builds unions unevaluated, nested and with closed infinite ends
        item = stack.pop()
        if isinstance(item, sympy.Union):
            stack.extend(item.args)
        elif isinstance(item, sympy.Interval):
            pieces.append(sympy.Interval(item.start, item.end, item.left_open, item.right_open))
        elif item is not sympy.S.EmptySet:
            return None
    merged = sympy.Union(*pieces)
    parts = merged.args if isinstance(merged, sympy.Union) else (() if merged is sympy.S.EmptySet else (merged,))
    if not all(isinstance(part, sympy.Interval) for part in parts):
        return None
    try:
        ordered = sorted(parts, key=lambda part: float(part.start))
    except TypeError:  # a symbolic end point that has no numeric value
        return None
    return [(part.start, part.end, bool(part.left_open), bool(part.right_open)) for part in ordered]


def _relation_set(expr):
    """``(real solution set, its symbols)`` of an inequality or a conjunction of them, else None."""
    import sympy
    from sympy.core.relational import Relational

    if not isinstance(expr, sympy.Basic):
        return None
    relations = expr.args if isinstance(expr, sympy.And) else (expr,)
    if not relations or not all(isinstance(r, Relational) and not isinstance(r, sympy.Eq) for r in relations):
        return None
    if len(expr.free_symbols) != 1:
        return None
    try:
        return expr.as_set(), expr.free_symbols
    except Exception:  # sympy cannot solve it over the reals
        return None


def solution_set(text: str, parse: Callable[[str], list]) -> Optional[List[Interval]]:
    """The intervals a normalised answer describes, or None when it is not a set of reals written as intervals
    or as inequalities in one variable joined by "or"/"and" (``parse``: text -> math-verify's parse list)."""
    import sympy

    text = _MEMBERSHIP.sub("", text.strip())
    if not text or len(text) > _MAX_CHARS:
        return None
    if not INEQUALITY.search(text):
        parsed = parse(text)
        return _intervals(parsed[0]) if parsed and isinstance(parsed[0], sympy.Set) else None
    alternatives = [_AND.split(alternative) for alternative in _OR.split(text)]
    if sum(len(conjuncts) for conjuncts in alternatives) > _MAX_PIECES:
        return None
    symbols: set = set()
    union = sympy.S.EmptySet
    for conjuncts in alternatives:
        both = sympy.S.Reals
        for piece in conjuncts:
            parsed = parse(piece)
            solved = _relation_set(parsed[0]) if parsed else None
            if solved is None:
                return None
            both = sympy.Intersection(both, solved[0])
            symbols |= solved[1]
        union = sympy.Union(union, both)
    return _intervals(union) if len(symbols) == 1 else None


def _same_point(a, b, rel_tol: float) -> bool:
    import sympy

    if a == b:
        return True
    if a.is_infinite or b.is_infinite:
        return False
    try:
        difference, scale = abs(float(sympy.N(a - b, 30))), max(abs(float(sympy.N(a))), abs(float(sympy.N(b))))
    except (TypeError, ValueError):
        return False
    return difference <= rel_tol * max(scale, 1e-300)


def same_sets(gold: List[Interval], pred: List[Interval], rel_tol: float = 1e-9) -> bool:
    """Equal interval lists: the same ends, open or closed alike, end points equal within ``rel_tol``."""
    return len(gold) == len(pred) and all(
        g[2:] == p[2:] and _same_point(g[0], p[0], rel_tol) and _same_point(g[1], p[1], rel_tol)
        for g, p in zip(gold, pred))
