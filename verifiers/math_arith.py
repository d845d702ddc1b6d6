"""Exact, bounded evaluation of a plain arithmetic answer (``1+2+\\cdots`` written out, ``\\frac{3}{4}\\cdot 8``).

``evaluate`` reads a normalised answer made only of numbers, ``+ - * / ^``, ``\\cdot``, ``\\times``,
``\\div``, ``\\frac{..}{..}``, parentheses and braces, and returns its exact value as a Fraction, or None when
the answer is anything else (a letter, a root, an implicit product such as ``2(3)``): sympy decides those. It
is one left-to-right pass (recursive descent, no backtracking), so a sum of hundreds of terms costs
microseconds where sympy takes seconds; powers are computed only when small (``MAX_BITS``), otherwise it
raises ``TooComplex``.
"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import List, Optional

from .math_budget import MAX_BITS, MAX_DEPTH, TooComplex
from .math_normalize import repeating_decimal

_TOKEN_RE = re.compile(
    r"\s*(?:(?P<number>\d*\.?\d*\\overline\{\d+\}|\d+(?:\.\d*)?|\.\d+)"
    r"|(?P<op>\\cdot|\\times|\\div|\\frac|[-+*/^(){}]))")


class _NotArithmetic(Exception):
    """The answer is not plain arithmetic (sympy decides it)."""


def _tokens(text: str) -> List[str]:
    tokens, at = [], 0
    text = text.strip()
    while at < len(text):
        match = _TOKEN_RE.match(text, at)
        if not match or match.end() == at:
            raise _NotArithmetic
        tokens.append(match.group("number") or match.group("op"))
        at = match.end()
    return tokens


def _number(token: str) -> Fraction:
    if "\\overline" in token:
        value = repeating_decimal(token)
        if value is None:
            raise _NotArithmetic
        return value
    return Fraction(token)


def _bits(value: Fraction) -> int:
    return max(value.numerator.bit_length(), value.denominator.bit_length())


class _Parser:
    """Recursive descent over the tokens: expr := term (+|- term)*, term := unary (*|/ unary)*,
    unary := (-|+) unary | power, power := atom [^ group], atom := number | (expr) | {expr} | \\frac group group."""

    def __init__(self, tokens: List[str]) -> None:
        self.tokens = tokens
        self.at = 0
        self.depth = 0

    def peek(self) -> Optional[str]:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, expected: Optional[str] = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise _NotArithmetic
        self.at += 1
        return token

    def expr(self) -> Fraction:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise TooComplex(f"the expression nests deeper than {MAX_DEPTH} levels")
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
            if _bits(value) > MAX_BITS:  # a sum of fractions grows its denominator
                raise TooComplex("a sum is too large to compute exactly")
        self.depth -= 1
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek() in ("*", "/", "\\cdot", "\\times", "\\div"):
            op = self.take()
            right = self.unary()
            if op in ("/", "\\div"):
                if right == 0:
                    raise _NotArithmetic
                value /= right
            else:
                value *= right
            if _bits(value) > MAX_BITS:
                raise TooComplex("a product is too large to compute exactly")
        return value

    def unary(self) -> Fraction:
        negative = False
        while self.peek() in ("-", "+"):  # a loop, not recursion: "------5" is flat
            negative ^= self.take() == "-"
        value = self.power()
        return -value if negative else value

    def power(self) -> Fraction:
        base = self.atom()
        if self.peek() != "^":
            return base
        self.take("^")
        exponent = self.group()
        if self.peek() == "^":  # a^b^c: leave the reading to sympy
            raise _NotArithmetic
        if exponent.denominator != 1:
            raise _NotArithmetic
        if base in (0, 1, -1):
            if base == 0 and exponent < 0:
                raise _NotArithmetic
            return base ** int(exponent)
        if abs(exponent) * _bits(base) > MAX_BITS:
            raise TooComplex("a power is too large to compute exactly")
        return base ** int(exponent)

    def group(self) -> Fraction:
        """A LaTeX argument: ``{expr}`` or a single digit (``\\frac12``, ``2^3``)."""
        token = self.peek()
        if token == "{":
            return self.atom()
        if token is not None and token.isdigit():  # one digit is the argument: \frac12 is 1/2, 2^10 is 2^1 0
            if len(token) == 1:
                self.take()
            else:
                self.tokens[self.at] = token[1:]
            return Fraction(int(token[0]))
        raise _NotArithmetic

    def atom(self) -> Fraction:
        token = self.take()
        if token in ("(", "{"):
            value = self.expr()
            self.take(")" if token == "(" else "}")
            return value
        if token == "\\frac":
            numerator, denominator = self.group(), self.group()
            if denominator == 0:
                raise _NotArithmetic
            return numerator / denominator
        if token[0].isdigit() or token[0] == ".":
            return _number(token)
        raise _NotArithmetic


def evaluate(text: str) -> Optional[Fraction]:
    """The exact value of a plain arithmetic answer, or None when ``text`` is not one (see the module
    docstring). Raises ``TooComplex`` for a power or product over ``MAX_BITS`` or nesting over ``MAX_DEPTH``."""
    try:
        tokens = _tokens(text)
        if not tokens:
            return None
        parser = _Parser(tokens)
        value = parser.expr()
        if parser.peek() is not None:  # two values side by side ("2 3", "2(3)"): not plain arithmetic
            return None
        return value
    except (_NotArithmetic, ValueError, ZeroDivisionError):
        return None
