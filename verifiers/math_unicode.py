"""Answers written with Unicode math symbols, rewritten as the LaTeX that the rest of the verifier reads.

``unicode_to_latex("2√3")`` is ``2\\sqrt{3}``; likewise ``x²`` -> ``x^{2}``, ``10⁻³`` -> ``10^{-3}``,
``π`` -> ``\\pi``, ``×`` -> ``\\times``, ``÷`` -> ``\\div``, ``·`` -> ``\\cdot``, the minus sign ``−`` -> ``-``,
``≤ ≥ ≠`` -> ``\\le \\ge \\ne``, ``∞`` -> ``\\infty``, ``½`` -> ``\\frac{1}{2}`` (any vulgar fraction),
``∪ ∩ ∈ ±``, common Greek letters, and full-width ASCII (``７２``) -> ASCII. A root sign takes the number,
letter, command, or bracketed group right after it (``√(x+1)`` -> ``\\sqrt{x+1}``). One pass over the text.
"""
from __future__ import annotations

import re
import unicodedata
from typing import Dict, List

_SYMBOLS: Dict[str, str] = {
    "\u2212": "-", "\u2013": "-", "\ufe63": "-", "\u2010": "-", "\u2011": "-",
    "×": "\\times", "÷": "\\div", "·": "\\cdot", "⋅": "\\cdot", "∙": "\\cdot", "∗": "*", "⁄": "/", "∕": "/",
    "≤": "\\le", "⩽": "\\le", "≥": "\\ge", "⩾": "\\ge", "≠": "\\ne", "≈": "\\approx",
    "∞": "\\infty", "∪": "\\cup", "∩": "\\cap", "∈": "\\in", "±": "\\pm", "∓": "\\mp", "∅": "\\emptyset",
    "π": "\\pi", "θ": "\\theta", "α": "\\alpha", "β": "\\beta", "γ": "\\gamma", "δ": "\\delta",
    "λ": "\\lambda", "μ": "\\mu", "σ": "\\sigma", "φ": "\\phi", "ω": "\\omega", "Δ": "\\Delta",
    "ℝ": "\\mathbb{R}", "ℤ": "\\mathbb{Z}", "ℕ": "\\mathbb{N}", "ℚ": "\\mathbb{Q}", "ℂ": "\\mathbb{C}",
    "′": "'", "″": "''",
}
_SUPERSCRIPTS = dict(zip("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿⁱ", "0123456789+-=()ni"))
_SUBSCRIPTS = dict(zip("₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎", "0123456789+-=()"))
_ROOTS = {"√": "\\sqrt", "∛": "\\sqrt[3]", "∜": "\\sqrt[4]"}
_ROOT_OPERAND_RE = re.compile(r"\s*(\d+(?:\.\d+)?|\\[a-zA-Z]+|[a-zA-Z])")
_CLOSING = {"(": ")", "{": "}", "[": "]"}
_MAX_BRACKET_SCAN = 200
"""A root's bracketed operand is looked for within this many characters (keeps the pass linear)."""


def _vulgar_fraction(ch: str) -> str:
    """``\\frac{1}{2}`` for ``½`` (from the character's Unicode decomposition), or '' when ``ch`` is not one."""
    parts = unicodedata.decomposition(ch).split()
    if len(parts) < 3 or parts[0] != "<fraction>":
        return ""
    text = "".join(chr(int(code, 16)) for code in parts[1:])
    numerator, _, denominator = text.partition("\u2044")
    if numerator.isdigit() and denominator.isdigit():
        return f"\\frac{{{numerator}}}{{{denominator}}}"
    return ""


def _root_operand(text: str, at: int) -> tuple:
    """``(operand, end)`` of the root sign whose operand starts at ``text[at]``; ``("", at)`` when unclear."""
    opening = text[at:at + 1]
    if opening in _CLOSING:
        depth, limit = 0, min(len(text), at + _MAX_BRACKET_SCAN)
        for i in range(at, limit):
            if text[i] == opening:
                depth += 1
            elif text[i] == _CLOSING[opening]:
                depth -= 1
                if depth == 0:
                    return text[at + 1:i], i + 1
        return "", at
    match = _ROOT_OPERAND_RE.match(text, at)
    return (match.group(1), match.end()) if match else ("", at)


def _script(text: str, at: int, table: Dict[str, str]) -> tuple:
    """``(run, end)``: the run of super- or subscript characters starting at ``text[at]``, mapped to ASCII."""
    end = at
    while end < len(text) and text[end] in table:
        end += 1
    return "".join(table[ch] for ch in text[at:end]), end


def _map_symbols(text: str) -> str:
    """Every Unicode symbol but the root signs written as LaTeX/ASCII."""
    out: List[str] = []
    at = 0
    while at < len(text):
        ch = text[at]
        if ch in _SUPERSCRIPTS or ch in _SUBSCRIPTS:
            table, mark = (_SUPERSCRIPTS, "^") if ch in _SUPERSCRIPTS else (_SUBSCRIPTS, "_")
            run, at = _script(text, at, table)
            out.append(f"{mark}{{{run}}}")
            continue
        at += 1
        if ch.isascii() or ch in _ROOTS:
            out.append(ch)
        elif "\uff01" <= ch <= "\uff5e":  # full-width ASCII
            out.append(chr(ord(ch) - 0xFEE0))
        else:
            replacement = _SYMBOLS.get(ch) or _vulgar_fraction(ch) or ch
            out.append(replacement)
            if replacement[:1] == "\\" and replacement[-1].isalpha() and text[at:at + 1].isalpha():
                out.append(" ")  # "πr" -> "\pi r", not the unknown command "\pir"
    return "".join(out)


def _rewrite_roots(text: str) -> str:
    """``√x`` -> ``\\sqrt{x}`` (and cube/fourth roots) in a text whose other symbols are already LaTeX."""
    out: List[str] = []
    at = 0
    while at < len(text):
        ch = text[at]
        at += 1
        if ch not in _ROOTS:
            out.append(ch)
            continue
        operand, end = _root_operand(text, at)
        out.append(f"{_ROOTS[ch]}{{{operand}}}" if operand else _ROOTS[ch])
        at = end
    return "".join(out)


def unicode_to_latex(text: str) -> str:
    """``text`` with its Unicode math symbols written as LaTeX (see the module docstring)."""
    if text.isascii():
        return text
    mapped = _map_symbols(text)
    return _rewrite_roots(mapped) if any(root in mapped for root in _ROOTS) else mapped
