"""The ``math`` verifier: is the final answer of a response equal to the gold answer?

Pipeline for one response:

1. extract the answer (``math_extract.extract_answer``: last box, ``####``, "the answer is", final line);
2. normalise both sides (``math_normalize.normalize_answer``) and accept an exact string match;
3. fast numeric path: both sides plain numbers (``1,000``, ``0.50``, ``3/4``) -> exact Fraction comparison;
   a side written as inequalities (``1 < x < 5``, ``x < 2 or x > 3``) against intervals or inequalities ->
   the sets of reals they describe are compared (``math_sets``);
4. otherwise math-verify (sympy) decides, with its own signal.alarm timeouts disabled (they fail off the
   main thread; the VerifierPool enforces time by killing the worker), and an exact-value check that
   rejects math-verify's float-rounding false positives such as ``1/2004!`` vs ``1/2006!``.

The gold answer is parsed once per distinct string (an LRU cache), so the n samples of a prompt share it.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, List, Optional, Tuple

from .base import Verifier, VerifyResult, register_verifier
from .math_extract import extract_answer, last_boxed, last_number
from .math_normalize import decimal_comma, normalize_answer, numbers_equal, parse_number
from .math_sets import INEQUALITY, same_sets, solution_set

_MAX_RESPONSE_TAIL = 4000
"""Only the last characters of a response are searched by math-verify's own extraction (bounded cost)."""
_EXACT_CHECK_DIGITS = 40
"""Digits used to re-check two exact numbers that math-verify called equal."""


def _math_verify():
    """Import math-verify lazily (sympy takes a while) and silence its 'timeout disabled' warnings."""
    import math_verify
    from math_verify import grader, parser

    parser.TIMEOUT_WARNING_SHOWN = True
    grader.TIMEOUT_WARNING_SHOWN = True
    return math_verify


@functools.lru_cache(maxsize=1)
def _extraction_config() -> tuple:
    mv = _math_verify()
    return (mv.LatexExtractionConfig(), mv.ExprExtractionConfig())


def mv_parse(text: str) -> list:
    """math-verify's parse with its alarm-based timeout disabled; ``[]`` when nothing parses."""
    if not text:
        return []
    mv = _math_verify()
    try:
        return mv.parse(text, extraction_config=_extraction_config(), parsing_timeout=None)
    except Exception:  # math-verify swallows most errors itself; anything else means "unparseable"
        return []


def _as_latex(answer: str) -> str:
    """Wrap a bare answer in ``$...$`` so math-verify's LaTeX extraction sees it."""
    if any(marker in answer for marker in ("$", "\\(", "\\[", "\\boxed")):
        return answer
    return f"${answer}$"


def _parse_answer(answer: str) -> list:
    return mv_parse(_as_latex(answer))


@dataclass
class ParsedGold:
    """A gold answer prepared for comparison; built once per distinct gold string."""

    raw: str
    """The ground truth as given."""
    normalized: str
    """``normalize_answer`` of the gold's answer part (its last box when it holds one)."""
    number: Optional[Fraction]
    """The exact value when the gold is a plain number, else None."""
    _sympy: Optional[list] = None
    _solution_set: Any = False  # False: not computed yet

    @property
    def solution_set(self) -> Optional[list]:
        """The gold as intervals when it describes a set of reals (``math_sets.solution_set``), else None."""
        if self._solution_set is False:
            self._solution_set = solution_set(self.normalized, _parse_answer)
        return self._solution_set

    @property
    def sympy(self) -> list:
        """math-verify's parse of the gold (computed on first use: plain numbers rarely need it)."""
        if self._sympy is None:
            self._sympy = mv_parse(_as_latex(self.normalized)) or mv_parse(_as_latex(self.raw))
        return self._sympy


@functools.lru_cache(maxsize=4096)
def parse_gold(ground_truth: str) -> ParsedGold:
    """Prepare ``ground_truth`` once; cached so that repeated golds cost nothing."""
    text = str(ground_truth).strip()
    if text.startswith("####"):
        text = text[4:].strip()
    boxed = last_boxed(text)  # a gold written as a response: read it the way responses are read
    answer_part = boxed if boxed is not None else text
    normalized = normalize_answer(answer_part)
    return ParsedGold(raw=text, normalized=normalized, number=parse_number(normalized))


def _exact_number(expr: Any):
    """The sympy value of ``expr`` when it is an exact number (no symbols, no floats), else None."""
    try:
        import sympy

        if isinstance(expr, sympy.Expr) and expr.is_number and not expr.has(sympy.Float):
            return expr
    except Exception:
        return None
    return None


def _exact_values_differ(gold: list, pred: list) -> bool:
    """True when both first parses are exact numbers whose values differ at high precision.

    math-verify compares numbers after rounding to a few places, so ``1/2004!`` and ``1/2006!`` (both ~0)
    come out equal; exact inputs deserve an exact answer.
    """
    if not gold or not pred:
        return False
    a, b = _exact_number(gold[0]), _exact_number(pred[0])
    if a is None or b is None:
        return False
    try:
        va, vb = a.evalf(_EXACT_CHECK_DIGITS), b.evalf(_EXACT_CHECK_DIGITS)
        scale = max(abs(va), abs(vb))
        if scale == 0:
            return False
        return bool(abs(va - vb) > scale * 10 ** (-(_EXACT_CHECK_DIGITS - 10)))
    except Exception:
        return False


def _same_choice(a: str, b: str) -> bool:
    """``C`` against ``C. x = 42`` or ``(C)``: one side is a bare choice letter that starts the other."""
    for letter, other in ((a, b), (b, a)):
        letter = letter.strip("() ")
        if len(letter) == 1 and "A" <= letter <= "J":
            return bool(re.match(rf"^\(?{letter}(?:[.):]|\s*$)", other.strip()))
    return False


@register_verifier("math")
class MathVerifier(Verifier):
    """Scores 1.0 when the response's final answer equals the gold answer (see the module docstring).

    Options:
        float_rounding: decimal places math-verify rounds floats to before comparing (default 6).
        numeric_rel_tol: relative tolerance of the fast numeric path (default 1e-9: exact for GSM8K).
        fallback_last_number: when the response states no answer, compare its last number with a numeric gold
            (GSM8K "flexible" scoring; default True).
    """

    def __init__(self, float_rounding: int = 6, numeric_rel_tol: float = 1e-9,
                 fallback_last_number: bool = True, **options: Any) -> None:
        super().__init__(float_rounding=float_rounding, numeric_rel_tol=numeric_rel_tol,
                         fallback_last_number=fallback_last_number, **options)
        self.float_rounding = int(float_rounding)
        self.numeric_rel_tol = float(numeric_rel_tol)
        self.fallback_last_number = bool(fallback_last_number)

    # -- public API --------------------------------------------------------------------------------
    def verify(self, response: str, ground_truth: Any, **extra: Any) -> VerifyResult:
        """Score one response against ``ground_truth`` (a number string or a LaTeX answer)."""
        if ground_truth is None or not str(ground_truth).strip():
            return VerifyResult.incorrect("empty ground truth", extracted=None)
        if not isinstance(response, str):
            return VerifyResult.incorrect(f"response is {type(response).__name__}, not str", extracted=None)
        gold = parse_gold(str(ground_truth))
        answer, method = extract_answer(response)
        if method == "unclosed_box":  # cut off inside its final answer: nothing to credit, not even a last number
            return VerifyResult.incorrect("the final \\boxed{ never closes (a truncated response)", extracted=None,
                                          method=method)
        if answer is None:
            return self._verify_unmarked(response, gold)
        equal, how = self.answers_equal(gold, answer)
        return self._result(equal, answer, method, how)

    def verify_many(self, response_list: list, ground_truth: Any, **extra: Any) -> List[VerifyResult]:
        """Several responses to one prompt; the gold is parsed once (``parse_gold`` is cached)."""
        return [self.verify(response, ground_truth, **extra) for response in response_list]

    def answers_equal(self, gold: ParsedGold, answer: str) -> Tuple[bool, str]:
        """``(equal, how)`` for an extracted answer string against a prepared gold."""
        normalized = normalize_answer(answer)
        if not normalized:
            return False, "empty answer"
        if normalized == gold.normalized:
            return True, "normalized strings match"
        number = parse_number(normalized)
        if gold.number is not None and number is None:
            comma_decimal = decimal_comma(normalized)
            number = parse_number(comma_decimal) if comma_decimal is not None else None
        gold_number = gold.number
        if number is not None and gold_number is None:  # a gold written with a decimal comma ("0,111")
            comma_decimal = decimal_comma(gold.normalized)
            gold_number = parse_number(comma_decimal) if comma_decimal is not None else None
        if number is not None and gold_number is not None:
            return numbers_equal(number, gold_number, self.numeric_rel_tol), "numeric"
        if _same_choice(normalized, gold.normalized):
            return True, "multiple-choice letter"
        if INEQUALITY.search(normalized) or INEQUALITY.search(gold.normalized):  # an interval vs inequalities
            gold_set, pred_set = gold.solution_set, solution_set(normalized, _parse_answer)
            if gold_set is not None and pred_set is not None:
                return same_sets(gold_set, pred_set, self.numeric_rel_tol), "solution sets"
        return self._sympy_equal(gold, mv_parse(_as_latex(normalized)) or mv_parse(_as_latex(answer)))

    # -- internals ---------------------------------------------------------------------------------
    def _sympy_equal(self, gold: ParsedGold, pred: list) -> Tuple[bool, str]:
        if not gold.sympy:
            return False, "gold answer could not be parsed"
        if not pred:
            return False, "answer could not be parsed"
        mv = _math_verify()
        try:
            equal = mv.verify(gold.sympy, pred, float_rounding=self.float_rounding, timeout_seconds=None)
        except Exception as exc:  # a comparison error means "not shown equal"
            return False, f"math-verify error: {type(exc).__name__}"
        if equal and _exact_values_differ(gold.sympy, pred):
            return False, "exact values differ (math-verify rounding false positive rejected)"
        return bool(equal), "math-verify"

    def _verify_unmarked(self, response: str, gold: ParsedGold) -> VerifyResult:
        """No marked answer: math-verify's own extraction, then (numeric gold) the last number."""
        tail = response[-_MAX_RESPONSE_TAIL:]
        if self.fallback_last_number and gold.number is not None:
            number_text = last_number(tail)
            if number_text is not None:
                equal, how = self.answers_equal(gold, number_text)
                return self._result(equal, number_text, "last_number", how)
        pred = mv_parse(tail)
        if pred:
            equal, how = self._sympy_equal(gold, pred)
            return self._result(equal, str(pred[-1]), "math_verify_extract", how)
        return VerifyResult.incorrect("no answer found in the response", extracted=None, method="none")

    @staticmethod
    def _result(equal: bool, answer: str, method: str, how: str) -> VerifyResult:
        reason = f"correct ({how})" if equal else f"not equal ({how})"
        return VerifyResult(score=1.0 if equal else 0.0, correct=bool(equal),
                            info={"extracted": answer, "method": method, "reason": reason})
