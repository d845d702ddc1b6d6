"""The ``math`` verifier: is the final answer of a response equal to the gold answer?

Pipeline for one response:

1. extract the answer (``math_extract.extract_answer``: the last box, and only it when there is one; without a
   box, "final answer is", ``####``, "the answer is", the final line);
2. normalise both sides (``math_normalize.normalize_answer``) and accept an exact string match;
3. fast numeric path: both sides plain numbers (``1,000``, ``0.50``, ``3/4``, ``0.\\overline{3}``) -> exact
   Fraction comparison; a side that is plain arithmetic (``1+2+...+400`` written out) is evaluated exactly
   (``math_arith``); a side written as inequalities (``1 < x < 5``, ``x < 2 or x > 3``) against intervals or
   inequalities -> the sets of reals they describe are compared (``math_sets``);
4. otherwise math-verify (sympy) decides, with its own signal.alarm timeouts disabled, and an exact-value
   check that rejects math-verify's float-rounding false positives such as ``1/2004!`` vs ``1/2006!``.

Bounded work, in the calling thread (``math_budget``): extraction is linear in the response; an answer over
``MAX_ANSWER_CHARS``, a non-arithmetic answer over ``MAX_SYMBOLIC_CHARS`` (or twice the gold's length), a
parsed expression over the node budget or with a power/factorial too large to compute, and comparisons past
the fast numeric path that run longer than ``time_budget_s`` score 0 with a reason starting ``too_complex``
(``info["too_complex"] = True``).
A response with no marked answer is read by ``math_fallback`` (its final statement, never a list of numbers).

The gold answer is parsed once per distinct string (an LRU cache), so the n samples of a prompt share it.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, List, Optional, Tuple

from .base import Verifier, VerifyResult, register_verifier
from .math_arith import evaluate
from .math_budget import TooComplex, check_expression, time_budget
from .math_extract import extract_answer, last_boxed
from .math_fallback import MAX_NUMBERS, final_number, strip_chat_tokens
from .math_normalize import decimal_comma, normalize_answer, numbers_equal, parse_number
from .math_sets import INEQUALITY, same_sets, solution_set

MAX_ANSWER_CHARS = 5000
"""A longer extracted answer is ``too_complex`` before any work (normalising it would already cost)."""
MAX_SYMBOLIC_CHARS = 400
"""A longer answer that is not plain arithmetic is ``too_complex`` unless the gold is at least half as long
(a gold matrix or list may be long; MATH-500's longest gold is 53 characters)."""
_UNMARKED_LINE_CHARS = 1000
"""Of a response with no marked answer, math-verify's own extraction reads at most this much of the final line."""
_MATH_SEGMENT = re.compile(r"\$\$.+?\$\$|\$.+?\$|\\\(.+?\\\)|\\\[.+?\\\]", re.DOTALL)
_PLAIN_NUMBER_IN_TEXT = re.compile(r"\d+(?:[.,]\d+)*")
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
    """math-verify's parse with its alarm-based timeout disabled; ``[]`` when nothing parses.

    Raises ``TooComplex`` when the parsed expression is over the static budget (``check_expression``), before
    anything evaluates it.
    """
    if not text:
        return []
    mv = _math_verify()
    try:
        parsed = mv.parse(text, extraction_config=_extraction_config(), parsing_timeout=None)
    except Exception:  # math-verify swallows most errors itself; anything else means "unparseable"
        return []
    check_expression(parsed)
    return parsed


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
    _value: Any = False  # False: not computed yet

    @property
    def value(self) -> Optional[Fraction]:
        """The exact value when the gold is a plain number or plain arithmetic (``math_arith``), else None."""
        if self._value is False:
            try:
                self._value = self.number if self.number is not None else evaluate(self.normalized)
            except TooComplex:
                self._value = None
        return self._value

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


MARKED_METHODS = ("boxed", "answer_phrase", "gsm8k")
"""``extract_answer``'s methods that find an answer the response marks (``final_line`` and ``none`` do not)."""


@register_verifier("math")
class MathVerifier(Verifier):
    """Scores 1.0 when the response's final answer equals the gold answer (see the module docstring).

    Options:
        float_rounding: decimal places math-verify rounds floats to before comparing (default 6).
        numeric_rel_tol: relative tolerance of the fast numeric path (default 1e-9: exact for GSM8K).
        fallback_last_number: when the response marks no answer, compare the number its final statement
            states with a numeric gold (GSM8K "flexible" scoring, ``math_fallback``; default True).
        require_marked_answer: credit only an answer the response marks (a box, a "the answer is" or "final
            answer" phrase, a ``####`` line): without one it scores 0, whatever its final line or last number
            says (default False). ``fallback_last_number=false`` alone is not this: the final line is still read.
        time_budget_s: wall-clock seconds the comparisons past the fast numeric path (arithmetic, sets, sympy)
            may take before the response scores 0 as ``too_complex`` (default 5.0, under the VerifierPool's
            10 s; 0 or None: no limit).
        answer_kind: ``"number"``: credit only an answer that states one plain number (``17``, ``-55``, ``1,000``,
            ``0.5``, ``3/4``), alone or as the last side of an equation (``28 - 72 + 61 = 17`` states 17, and only
            17 is compared); an expression still to evaluate (``28 - 72 + 61``), an equation that ends in one, or
            text scores 0, reason ``not a number``. For tasks whose question is the expression (the generated
            arithmetic ones set it per row, ``extra_info.answer_kind``, which wins over this option): otherwise
            restating the question in the box is credited as its value. ``"any"`` (default): every form the
            pipeline compares.
    """

    ANSWER_KINDS = ("any", "number")

    def __init__(self, float_rounding: int = 6, numeric_rel_tol: float = 1e-9,
                 fallback_last_number: bool = True, time_budget_s: Optional[float] = 5.0,
                 require_marked_answer: bool = False, answer_kind: str = "any", **options: Any) -> None:
        super().__init__(float_rounding=float_rounding, numeric_rel_tol=numeric_rel_tol,
                         fallback_last_number=fallback_last_number, time_budget_s=time_budget_s,
                         require_marked_answer=require_marked_answer, answer_kind=answer_kind, **options)
        self.require_marked_answer = bool(require_marked_answer)
        self.answer_kind = self._answer_kind(answer_kind, "math verifier option answer_kind")
        self.float_rounding = int(float_rounding)
        self.numeric_rel_tol = float(numeric_rel_tol)
        self.fallback_last_number = bool(fallback_last_number)
        if time_budget_s is not None and (not isinstance(time_budget_s, (int, float)) or time_budget_s < 0):
            raise ValueError(f"math verifier option time_budget_s must be a number >= 0 or None, got {time_budget_s!r}")
        self.time_budget_s = float(time_budget_s) if time_budget_s else None

    @classmethod
    def _answer_kind(cls, kind: Any, what: str) -> str:
        if kind not in cls.ANSWER_KINDS:
            raise ValueError(f"{what} must be one of {', '.join(cls.ANSWER_KINDS)}, got {kind!r}")
        return kind

    # -- public API --------------------------------------------------------------------------------
    def verify(self, response: str, ground_truth: Any, **extra: Any) -> VerifyResult:
        """Score one response against ``ground_truth`` (a number string or a LaTeX answer). ``extra`` is the row's
        ``extra_info``: its ``answer_kind``, when set, wins over the option."""
        if ground_truth is None or not str(ground_truth).strip():
            return VerifyResult.incorrect("empty ground truth", extracted=None)
        if not isinstance(response, str):
            return VerifyResult.incorrect(f"response is {type(response).__name__}, not str", extracted=None)
        gold = parse_gold(str(ground_truth))
        answer, method = extract_answer(response)
        if method == "unclosed_box":  # cut off inside its final answer: nothing to credit, not even a last number
            return VerifyResult.incorrect("the final \\boxed{ never closes (a truncated response)", extracted=None,
                                          method=method)
        if self.require_marked_answer and method not in MARKED_METHODS:
            return VerifyResult.incorrect("no marked answer (require_marked_answer: a box, an answer phrase or ####)",
                                          extracted=_preview(answer) if answer else None, method=method)
        kind = self._answer_kind(extra.get("answer_kind") or self.answer_kind, "the row's extra_info.answer_kind")
        if kind == "number" and answer is not None:
            stated = _stated_number(answer)
            if stated is None:
                return VerifyResult.incorrect("not a number: the answer is an expression or text, or an equation "
                                              "that ends in one, and this task asks for one number "
                                              "(answer_kind=number)",
                                              extracted=_preview(answer), method=method)
            answer = stated
        try:
            if answer is None:
                return self._verify_unmarked(response, gold)
            equal, how = self.answers_equal(gold, answer)
        except TooComplex as exc:
            return VerifyResult.incorrect(f"too_complex: {exc}", extracted=_preview(answer), method=method,
                                          too_complex=True)
        return self._result(equal, answer, method, how)

    def verify_many(self, response_list: list, ground_truth: Any, **extra: Any) -> List[VerifyResult]:
        """Several responses to one prompt; the gold is parsed once (``parse_gold`` is cached)."""
        return [self.verify(response, ground_truth, **extra) for response in response_list]

    def answers_equal(self, gold: ParsedGold, answer: str) -> Tuple[bool, str]:
        """``(equal, how)`` for an extracted answer string against a prepared gold.

        Raises ``TooComplex`` when the answer is over a budget (see the module docstring).
        """
        if len(answer) > MAX_ANSWER_CHARS:
            raise TooComplex(f"the answer is {len(answer)} characters long (limit {MAX_ANSWER_CHARS})")
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
        _math_verify()  # imported outside the time budget: an import stopped midway could leave sympy half-loaded
        with time_budget(self.time_budget_s):
            return self._bounded_equal(gold, answer, normalized, number)

    # -- internals ---------------------------------------------------------------------------------
    def _bounded_equal(self, gold: ParsedGold, answer: str, normalized: str,
                       number: Optional[Fraction]) -> Tuple[bool, str]:
        """The comparisons that may cost: exact arithmetic, solution sets, sympy (under the time budget)."""
        value = number if number is not None else evaluate(normalized)
        if value is not None and gold.value is not None:
            return numbers_equal(value, gold.value, self.numeric_rel_tol), "exact arithmetic"
        limit = max(MAX_SYMBOLIC_CHARS, 2 * len(gold.normalized))
        if len(normalized) > limit:
            raise TooComplex(f"the answer is {len(normalized)} characters of non-arithmetic math (limit {limit})")
        if INEQUALITY.search(normalized) or INEQUALITY.search(gold.normalized):  # an interval vs inequalities
            gold_set, pred_set = gold.solution_set, solution_set(normalized, _parse_answer)
            if gold_set is not None and pred_set is not None:
                return same_sets(gold_set, pred_set, self.numeric_rel_tol), "solution sets"
        return self._sympy_equal(gold, mv_parse(_as_latex(normalized)) or mv_parse(_as_latex(answer)))

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
        """No marked answer. A numeric gold: the number the final statement states (``math_fallback``; a list
        of numbers states none). Otherwise math-verify's own extraction on the final line, unless that line
        lists more than ``MAX_NUMBERS`` numbers outside math."""
        if self.fallback_last_number and gold.value is not None:
            number_text, why = final_number(response)
            if number_text is None:
                return VerifyResult.incorrect(why, extracted=None, method="last_number")
            equal, how = self.answers_equal(gold, number_text)
            return self._result(equal, number_text, "last_number", how)
        line = strip_chat_tokens(response[-4 * _UNMARKED_LINE_CHARS:]).rstrip()
        line = line[line.rfind("\n") + 1:][-_UNMARKED_LINE_CHARS:]
        listed = len(_PLAIN_NUMBER_IN_TEXT.findall(_MATH_SEGMENT.sub(" ", line)))
        if listed > MAX_NUMBERS:
            return VerifyResult.incorrect(f"no stated answer: the final line lists {listed} numbers", extracted=None,
                                          method="none")
        _math_verify()  # imported outside the time budget (see answers_equal)
        with time_budget(self.time_budget_s):
            pred = mv_parse(line)
            if pred:
                equal, how = self._sympy_equal(gold, pred)
                return self._result(equal, str(pred[-1]), "math_verify_extract", how)
        return VerifyResult.incorrect("no answer found in the response", extracted=None, method="none")

    @staticmethod
    def _result(equal: bool, answer: str, method: str, how: str) -> VerifyResult:
        reason = f"correct ({how})" if equal else f"not equal ({how})"
        return VerifyResult(score=1.0 if equal else 0.0, correct=bool(equal),
                            info={"extracted": answer, "method": method, "reason": reason})


def _stated_number(answer: str) -> Optional[str]:
    """The one plain number an extracted answer states: itself, or the last side of an equation (``a + b = 19``
    states 19); None when that is an expression or text. A decimal comma is read as a point too."""
    last = answer.rsplit("=", 1)[-1]
    normalized = normalize_answer(last)
    if parse_number(normalized) is not None:
        return last.strip()
    comma_decimal = decimal_comma(normalized)
    return last.strip() if comma_decimal is not None and parse_number(comma_decimal) is not None else None


def _preview(answer: Optional[str], limit: int = 200) -> Optional[str]:
    """An answer cut to ``limit`` characters for ``info`` (a too-long answer is not copied whole)."""
    if answer is None or len(answer) <= limit:
        return answer
    return answer[:limit] + f"... ({len(answer)} characters)"
