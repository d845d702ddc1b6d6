"""Normalising an answer string before comparison, and the fast numeric path.

``normalize_answer`` removes what does not change the value: math delimiters, ``\\left``/``\\right``,
spacing commands, ``\\text{...}`` units, currency, percent and degree signs, thousands separators,
trailing zeros. ``parse_number`` reads a plain number (``-1,000.50``, ``3/4``, ``\\frac{3}{4}``,
``2\\frac{1}{2}``, ``0.\\overline{3}``) as an exact Fraction so that GSM8K-style checks never reach sympy.
Unicode math symbols (``√2``, ``x²``, ``−5``, ``½``) are first rewritten as LaTeX (``math_unicode``).
"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Optional

from .math_unicode import unicode_to_latex

_DELIMITERS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))
_SPACING = re.compile(r"(?<!\\)\\[,;: ]|\\q?quad|~")
_LATEX_THOUSANDS = re.compile(r"(?<=\d)(?:\{,\}|,\\!|\{,\s*\})\s*(?=\d{3})")
_LEFT_RIGHT = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)(?![a-zA-Z])")
_FRAC_VARIANTS = re.compile(r"\\[dt]frac(?![a-zA-Z])")
_MATHRM_LETTER = re.compile(r"\\(?:mathrm|mathit|mathbf|textbf|textit|operatorname)\{([A-Za-z])\}")
_UNIT_WORDS = (
    "dollars?|cents?|units?|square units|sq units|cm|mm|km|m|meters?|metres?|inches|inch|feet|foot|ft|"
    "miles?|mph|hours?|hrs?|minutes?|mins?|seconds?|secs?|days?|weeks?|months?|years?|degrees?|"
    "pounds?|lbs?|ounces?|oz|kg|grams?|g|liters?|litres?|ml|gallons?|people|students?|apples?|marbles?"
)
_TEXT_UNIT = re.compile(r"\\(?:text|mbox|mathrm)\{\s*(?:" + _UNIT_WORDS + r")\s*\}(?:\^[23]|\^\{[23]\})?")
_TRAILING_TEXT = re.compile(r"(?<=[\d}])\s*\\(?:text|mbox|mathrm)\{[^{}]*\}$")
_TRAILING_UNIT = re.compile(r"(?<=[\d}])\s*(?:" + _UNIT_WORDS + r")(?:\^\{?[23]\}?)?\.?$")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textit|mathrm|mbox|mathbf)\{([^{}]*)\}")
_THOUSANDS = re.compile(r"^-?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?$")
_THOUSANDS_SPACE = re.compile(r"^-?\d{1,3}(?:(?:\\,| |\{,\})\d{3})+(?:\.\d+)?$")
_PLAIN_NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$")
_SLASH_FRACTION = re.compile(r"^([-+]?\d+)\s*/\s*(\d+)$")
_LATEX_FRACTION = re.compile(r"^([-+]?)\\frac(?:\{(\d+)\}|(\d))(?:\{(\d+)\}|(\d))$")
_MIXED_NUMBER = re.compile(r"^([-+]?\d+)\s*\\frac\{(\d+)\}\{(\d+)\}$")
_ASSIGNMENT = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?\s*=\s*(?=[^=a-zA-Z]+$)")
_ASSIGNMENT_FRAC = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?\s*=\s*(?=-?\\frac\{\d+\}\{\d+\}$)")
_DECIMAL_COMMA = re.compile(r"^(-?\d+),(\d{1,2}|\d{4,})$|^(-?0),(\d+)$")
_NUMBER_WITH_DOLLARS = re.compile(r"^\$?\s*-?[\d,.]+\s*\$?$")
_REPEATING_DECIMAL = re.compile(r"^([-+]?)(\d*)\.(\d*)\\(?:overline|bar|dot)(?:\{(\d+)\}|(\d))$")


def strip_delimiters(text: str) -> str:
    """Remove one layer of ``$...$``, ``$$...$$``, ``\\(...\\)`` or ``\\[...\\]`` around the whole string."""
    text = text.strip()
    for left, right in _DELIMITERS:
        if text.startswith(left) and text.endswith(right) and len(text) >= len(left) + len(right):
            inner = text[len(left):len(text) - len(right)]
            if left != "$" or "$" not in inner:
                return inner.strip()
    return text


def normalize_answer(text: str) -> str:
    """A canonical string for ``text`` (the value is unchanged; see the module docstring)."""
    if not isinstance(text, str):
        text = str(text)
    text = strip_delimiters(unicode_to_latex(text.strip()))
    text = _LEFT_RIGHT.sub("", text)
    text = _FRAC_VARIANTS.sub(r"\\frac", text)
    text = text.replace("bmatrix}", "pmatrix}")
    text = _MATHRM_LETTER.sub(r"\1", text)
    text = _LATEX_THOUSANDS.sub(",", text)
    text = text.replace("\\!", "")
    text = _TEXT_UNIT.sub("", text)
    text = text.replace("^\\circ", "").replace("^{\\circ}", "").replace("°", "").replace("\\circ", "")
    text = text.replace("\\%", "").replace("%", "").replace("\\$", "")
    if "$" in text and _NUMBER_WITH_DOLLARS.match(text):
        text = text.replace("$", "")
    text = re.sub(r"\\text\{\s*(?:percent|\%)\s*\}|\s+percent$", "", text)
    text = _SPACING.sub(" ", text).strip()
    text = _TRAILING_TEXT.sub("", text).strip()
    text = _TEXT_WRAPPER.sub(r"\1", text).strip()
    text = _TRAILING_UNIT.sub("", text).strip()
    text = text.rstrip(".").strip()
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    elif _THOUSANDS_SPACE.match(text):
        text = re.sub(r"\\,| |\{,\}", "", text)
    text = _ASSIGNMENT_FRAC.sub("", _ASSIGNMENT.sub("", text)).strip()
    text = re.sub(r"\s+", " ", text)
    if _PLAIN_NUMBER.match(text) and "." in text and "e" not in text.lower():
        text = text.rstrip("0").rstrip(".") or "0"
        if text in ("-", "+", "-0", "+0"):
            text = "0"
    return text


def decimal_comma(text: str) -> Optional[str]:
    """``1,22`` or ``0,111`` read with a decimal comma (``1.22``); None when ``text`` is not such a number.

    Only used for a prediction against a numeric gold: ``-2,1`` in a MATH gold is a list of two solutions.
    """
    match = _DECIMAL_COMMA.match(text.strip())
    if not match:
        return None
    whole, fraction = (match.group(1), match.group(2)) if match.group(1) is not None else match.group(3, 4)
    return f"{whole}.{fraction}"


def repeating_decimal(text: str) -> Optional[Fraction]:
    """The exact value of a repeating decimal such as ``0.\\overline{3}`` (1/3) or ``0.1\\overline{6}`` (1/6).

    ``I.A\\overline{R}`` (integer part I, digits A once, then R repeated) is ``I + (AR - A) / (10^a (10^r - 1))``
    with ``a``, ``r`` the lengths of A and R: 0.1666... = (16 - 1) / (10 * 9) = 1/6. ``\\bar``/``\\dot`` alike.
    """
    match = _REPEATING_DECIMAL.match(text.strip().replace(" ", ""))
    if not match:
        return None
    sign, whole, once, repeated = match.group(1), match.group(2), match.group(3), match.group(4) or match.group(5)
    if len(once) + len(repeated) > 40:
        return None
    value = int(whole or 0) + Fraction(int(once + repeated) - int(once or 0),
                                       10 ** len(once) * (10 ** len(repeated) - 1))
    return -value if sign == "-" else value


def parse_number(text: str) -> Optional[Fraction]:
    """An exact Fraction for a plain number string (already normalised), or None when it is not one."""
    text = text.strip().replace(" ", "")
    if not text or len(text) > 40:
        return None
    try:
        if _PLAIN_NUMBER.match(text):
            return Fraction(text)
        if "\\" in text:
            repeating = repeating_decimal(text)
            if repeating is not None:
                return repeating
        match = _SLASH_FRACTION.match(text)
        if match:
            denominator = int(match.group(2))
            return Fraction(int(match.group(1)), denominator) if denominator else None
        match = _LATEX_FRACTION.match(text)
        if match:
            numerator = int(match.group(2) or match.group(3))
            denominator = int(match.group(4) or match.group(5))
            value = Fraction(numerator, denominator) if denominator else None
            return -value if value is not None and match.group(1) == "-" else value
        match = _MIXED_NUMBER.match(text)
        if match:
            whole, numerator, denominator = int(match.group(1)), int(match.group(2)), int(match.group(3))
            if not denominator:
                return None
            part = Fraction(numerator, denominator)
            return whole - part if match.group(1).startswith("-") else whole + part
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return None


def numbers_equal(a: Fraction, b: Fraction, rel_tol: float = 1e-9) -> bool:
    """Exact equality, or a relative difference within ``rel_tol`` (decimals written to many places)."""
    if a == b:
        return True
    scale = max(abs(a), abs(b))
    return scale > 0 and abs(a - b) <= Fraction(rel_tol) * scale
