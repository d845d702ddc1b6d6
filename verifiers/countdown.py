"""The ``countdown`` verifier: does the response's boxed expression reach the target from the given numbers?

A countdown puzzle (``datasets/countdown.py``) gives numbers and a target; a response is correct when its last
``\\boxed{...}`` holds an arithmetic expression that

* is made of integer literals, ``+ - * /`` and parentheses only (no unary minus, no powers, no names, no calls:
  the text is checked character by character, then parsed with :mod:`ast` and every node is checked; nothing is
  ever run with ``eval``);
* uses each given number at most once (a number given twice may appear twice) and no number that is not given;
* equals the target exactly, in :class:`fractions.Fraction` arithmetic (``7 / 2 * 4`` is 14; a division by zero
  anywhere makes the response wrong).

``\\times``, ``\\cdot``, ``×``, ``\\div``, ``÷``, ``\\left(``/``\\right)`` and ``$`` are read as their plain forms; a
box holding ``expression = target`` counts as the expression. Without a box, the response's final line is the
answer when it is only such an expression (the base model writes ``41 + 15 = 56`` unboxed); otherwise ``no_box``.
The ground truth is the puzzle as JSON text, ``{"numbers": [...], "target": N}`` (a dict is read too); a ground
truth that is not a puzzle gets no verdict (``VerifyResult.failure``: the row is broken, not the response).
``info["reason"]`` says why a response scored as it did: ``correct``, ``no_box``, ``malformed``, ``not_allowed``,
``number_not_given``, ``number_reused``, ``division_by_zero``, ``wrong_value``.
"""
from __future__ import annotations

import ast
import json
import re
from collections import Counter
from fractions import Fraction
from typing import Any, List, Tuple

from .base import Verifier, VerifyResult, register_verifier
from .math_boxes import last_boxed

MAX_EXPRESSION_CHARS = 200
"""A longer boxed expression is ``malformed`` before it is parsed (a puzzle has at most a few numbers)."""
_ALLOWED_CHARS = re.compile(r"[0-9+\-*/() ]+")
_SPELLINGS = (("\\left", ""), ("\\right", ""), ("\\times", "*"), ("\\cdot", "*"), ("\u00d7", "*"), ("\\div", "/"),
              ("\u00f7", "/"), ("\\,", " "), ("\\ ", " "), ("$", ""), ("{", "("), ("}", ")"))
"""LaTeX and Unicode spellings read as the plain operators (braces as parentheses: ``\\left(`` leaves none)."""
_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


class Rejected(ValueError):
    """An expression the verifier does not accept; ``reason`` is the verdict's reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def parse_puzzle(ground_truth: Any) -> Tuple[Tuple[int, ...], int]:
    """``(numbers, target)`` of a ground truth (JSON text or a dict); ValueError naming what is wrong."""
    puzzle = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if not isinstance(puzzle, dict) or "numbers" not in puzzle or "target" not in puzzle:
        raise ValueError(f"a countdown ground truth is {{\"numbers\": [...], \"target\": N}}, not {ground_truth!r:.80}")
    numbers, target = puzzle["numbers"], puzzle["target"]
    if not numbers or not all(type(x) is int for x in numbers) or type(target) is not int:
        raise ValueError(f"countdown numbers and target must be integers, got {numbers!r:.60} and {target!r:.20}")
    return tuple(numbers), target


def plain_expression(text: str, target: int) -> str:
    """The box's text with the LaTeX/Unicode operators made plain and a trailing ``= target`` (or a leading
    ``target =``) taken off; an equation with any other side is ``malformed``."""
    for spelled, plain in _SPELLINGS:
        text = text.replace(spelled, plain)
    if "=" in text:
        sides = [side.strip() for side in text.split("=")]
        if len(sides) != 2 or str(target) not in sides:
            raise Rejected("malformed", f"an equation that does not state the target {target}: {text!r:.80}")
        text = sides[0] if sides[1] == str(target) else sides[1]
    return text.strip()


def _literals(node: ast.AST, out: List[int]) -> None:
    """Check that ``node`` is integer literals and ``+ - * /`` only (``Rejected`` otherwise), collecting the
    literals in ``out``."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        out.append(node.value)
    elif isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        _literals(node.left, out)
        _literals(node.right, out)
    else:
        what = type(node.op).__name__ if isinstance(node, (ast.BinOp, ast.UnaryOp)) else type(node).__name__
        raise Rejected("not_allowed", f"{what} is not allowed: only + - * / on the given numbers")


def value_of(node: ast.AST) -> Fraction:
    """The exact value of a checked expression node; ``Rejected`` (``division_by_zero``) on a zero divisor."""
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    left, right = value_of(node.left), value_of(node.right)
    if isinstance(node.op, ast.Add):
        return left + right
    if isinstance(node.op, ast.Sub):
        return left - right
    if isinstance(node.op, ast.Mult):
        return left * right
    if right == 0:
        raise Rejected("division_by_zero", "the expression divides by zero")
    return left / right


def parse_expression(text: str) -> Tuple[ast.AST, List[int]]:
    """``(tree, literals)`` of a plain expression: integer literals, ``+ - * /`` and parentheses only.
    ``Rejected`` otherwise (``malformed``, ``not_allowed``); the text is parsed, never run."""
    if not text or len(text) > MAX_EXPRESSION_CHARS:
        raise Rejected("malformed", f"an expression of {len(text)} characters (1 to {MAX_EXPRESSION_CHARS})")
    if not _ALLOWED_CHARS.fullmatch(text):
        bad = sorted(set(re.sub(r"[0-9+\-*/() ]", "", text)))
        raise Rejected("not_allowed", f"characters {''.join(bad)!r:.40} are not allowed: digits, + - * / ( ) only")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise Rejected("malformed", f"not an expression ({type(exc).__name__})") from None
    literals: List[int] = []
    _literals(tree.body, literals)
    return tree.body, literals


def check_numbers(literals: List[int], numbers: Tuple[int, ...]) -> None:
    """``Rejected`` when ``literals`` use a number that is not given, or one more often than given."""
    given, used = Counter(numbers), Counter(literals)
    for number, count in used.items():
        if number not in given:
            raise Rejected("number_not_given", f"{number} is not one of the numbers {list(numbers)}")
        if count > given[number]:
            raise Rejected("number_reused", f"{number} is used {count} times but given {given[number]}")


def final_line(response: str) -> str:
    """The response's last non-empty line, without markdown bold and a closing full stop."""
    lines = [line.strip() for line in response[-MAX_EXPRESSION_CHARS * 4:].splitlines() if line.strip()]
    return lines[-1].replace("**", "").rstrip(".").strip() if lines else ""


def judge(response: str, numbers: Tuple[int, ...], target: int) -> VerifyResult:
    """The verdict on one response to the puzzle (``numbers``, ``target``)."""
    if not isinstance(response, str):
        return VerifyResult.incorrect("no_box", extracted=None)
    boxed = last_boxed(response)
    if boxed is None:  # no box: a final line that is just the expression (or "expression = target") is the answer
        line = final_line(response)
        try:
            parse_expression(plain_expression(line, target))
        except Rejected:
            return VerifyResult.incorrect("no_box", extracted=None)
        boxed = line
    try:
        tree, literals = parse_expression(plain_expression(boxed, target))
        check_numbers(literals, numbers)  # before the value: a reused number is named even where it divides by 0
        value = value_of(tree)
    except Rejected as exc:
        return VerifyResult.incorrect(exc.reason, extracted=boxed, error=str(exc))
    if value != target:
        return VerifyResult.incorrect("wrong_value", extracted=boxed, value=str(value))
    return VerifyResult(score=1.0, correct=True, info={"reason": "correct", "extracted": boxed})


@register_verifier("countdown")
class CountdownVerifier(Verifier):
    """Exact verdicts on countdown puzzles (module docstring)."""

    def verify(self, response: str, ground_truth: Any, **extra: Any) -> VerifyResult:
        try:
            numbers, target = parse_puzzle(ground_truth)
        except (ValueError, TypeError) as exc:
            return VerifyResult.failure(f"bad countdown ground truth: {exc}")
        return judge(response, numbers, target)
