"""Reading the final answer out of a model response.

The order follows what models are asked to write: the last ``\\boxed{...}`` (or ``\\fbox{...}``), then a
"final answer is" phrase, a GSM8K ``#### answer`` line, a phrase such as "the answer is ...", a short final
line that looks like an answer. A response with a box is read by its box alone: a different answer stated
after it is not read (``extract_answer``), so hedging between two answers earns nothing. Nested braces are
matched (``math_boxes``). A response whose last box never closes was cut off: it has no answer; only a gold's
unclosed box (``last_boxed``) is read to the end of the text. Pure string work, linear in the length of the
response (every regex here either scans once or reads a bounded slice): no sympy, no math-verify.
"""
from __future__ import annotations

import re
from typing import Optional, Tuple

from .math_boxes import BOX_COMMANDS, boxed_contents, find_boxes, last_box_run, last_boxed  # noqa: F401

_HASH_RE = re.compile(r"####\s*([^\n]*)")
_ANSWER_KEYWORD_RE = re.compile(
    r"(?:final\s+answer|the\s+answer|answer|réponse|respuesta|antwort|答案|الإجابة)\s*(?:is\s*:?|[:=：]|est\s*:?|es\s*:?|(?=\$|\\\[|\\\())",
    re.IGNORECASE)
_FINAL_ANSWER_RE = re.compile(r"final\s+answer\s*(?:is\s*:?|[:=])", re.IGNORECASE)
_FINAL_LINE_MAX_CHARS = 60
_FINAL_LINE_MAX_LATEX_CHARS = 300
_WORD_RE = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}")
_MATH_SEGMENT_RE = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")
_LEADING_VALUE_RE = re.compile(r"\$[^$]+\$|-?\d[\d,]*(?:\.\d+)?(?:/\d+)?(?=\s|$)")
_MAX_ANSWER_CHARS = 1000
"""An answer read after a keyword is at most this long (keeps the later regexes linear-time in practice)."""


def _read_after_keyword(text: str) -> str:
    """The answer written after an "answer is"/"####" keyword: a delimited math block or the sentence."""
    text = text.lstrip()[:_MAX_ANSWER_CHARS]
    for left, right, inline in (("$$", "$$", False), ("\\[", "\\]", False), ("\\(", "\\)", True),
                                ("$", "$", True)):
        if text.startswith(left):
            close = len(left)
            while True:  # the closing delimiter, skipping escaped \$
                close = text.find(right, close)
                if close < 0 or right != "$" or text[close - 1] != "\\":
                    break
                close += 1
            # inline math does not span lines (Math-Verify's convention); display math may
            if close > 0 and not (inline and "\n" in text[:close]):
                return text[:close + len(right)].strip()
    match = re.search(r"\.(?:\s|$)|\n|。", text)
    answer = text[:match.start()] if match else text
    return answer.strip().rstrip(".;,!").strip().strip("*").strip()


def _is_wordy(text: str) -> bool:
    """Whether ``text`` reads as a sentence (several words outside math), not as a bare answer."""
    outside = _MATH_SEGMENT_RE.sub(" ", text)
    outside = re.sub(r"\\[a-zA-Z]+(\{[^{}]*\})?", " ", outside)
    latin_words = _WORD_RE.findall(outside)
    other_letters = sum(1 for ch in outside if ch.isalpha() and not ch.isascii())
    return len(latin_words) >= 2 or other_letters >= 2


def focus_answer(candidate: str, allow_last_number: bool = True) -> str:
    """Narrow a sentence such as "The volume is $120$ cubic units" to the answer inside it.

    With nothing better, the sentence's last number (``allow_last_number``) or the sentence itself.
    """
    if not _is_wordy(candidate):
        return candidate
    if " is " in candidate:
        tail = candidate.rsplit(" is ", 1)[1].strip()
        if tail and not _is_wordy(tail):
            return tail
        leading = _LEADING_VALUE_RE.match(tail)
        if leading:  # "120 cubic units", "$14$ apples"
            return leading.group(0).strip()
    if not _WORD_RE.search(_MATH_SEGMENT_RE.sub(" ", candidate)):  # words only in another script
        chunks = [chunk.strip(" .,:;*") for chunk in re.split(r"[^\x00-\x7f]+", candidate) if chunk.strip(" .,:;*")]
        if chunks and not _is_wordy(chunks[-1]):
            return chunks[-1]
    segments = [next(group for group in match.groups() if group is not None)
                for match in _MATH_SEGMENT_RE.finditer(candidate)]
    if segments:
        return segments[-1].strip()
    number = last_number(candidate) if allow_last_number else None
    return number if number is not None else candidate


def _looks_like_answer_line(line: str) -> bool:
    """Short, with at least one digit or LaTeX command, and not a sentence of words."""
    if not line or len(line) > _FINAL_LINE_MAX_LATEX_CHARS:  # the length first: the regexes below stay cheap
        return False
    has_math = any(ch.isdigit() for ch in line) or "\\" in line or "$" in line
    if not has_math:
        return len(line) <= 20 and len(line.split()) <= 3
    limit = _FINAL_LINE_MAX_CHARS if _is_wordy(line) else _FINAL_LINE_MAX_LATEX_CHARS
    return len(line) <= limit


def _last_line(text: str, limit: int = _FINAL_LINE_MAX_LATEX_CHARS + 1) -> str:
    """The last non-empty line of ``text``, read from at most its last ``limit`` characters' worth of line."""
    stripped = text.rstrip()
    start = stripped.rfind("\n") + 1
    return stripped[max(start, len(stripped) - limit):].strip()


def extract_answer(response: str) -> Tuple[Optional[str], str]:
    """``(answer_text, method)``; ``(None, "none")`` when the response states no answer.

    ``method`` is one of ``boxed``, ``gsm8k``, ``answer_phrase``, ``final_line``, ``none``. A response with a
    closed, non-empty box is read by its last box (run) alone: anything it says after the box ("no wait, the
    answer is 14", a ``####`` line) is not a second answer, so a response that boxes one answer and states another
    is never credited for either. Only without a box: a "final answer is ..." phrase, then a ``####`` line, then
    an "the answer is ..." phrase, then a short final line. ``(None, "unclosed_box")``: the last box never
    closes, so the response was cut off inside its answer (whatever it holds is not a stated answer). Linear in
    the length of the response.
    """
    if not isinstance(response, str) or not response.strip():
        return None, "none"
    boxes = find_boxes(response)
    if boxes and not all(box.closed for box in boxes):  # an unclosed box runs to the end: it holds the rest
        return None, "unclosed_box"
    if boxes:
        boxed = ", ".join(content for content in (box.content(response)
                                                  for box in last_box_run(response, boxes)) if content)
        if boxed:
            return boxed, "boxed"
    final_phrases = list(_FINAL_ANSWER_RE.finditer(response))
    if final_phrases:
        candidate = _read_after_keyword(response[final_phrases[-1].end():])
        if candidate:
            return focus_answer(candidate), "answer_phrase"
    hashes = list(_HASH_RE.finditer(response))
    if hashes and hashes[-1].group(1).strip():
        return _read_after_keyword(hashes[-1].group(1)) or hashes[-1].group(1).strip(), "gsm8k"
    phrases = list(_ANSWER_KEYWORD_RE.finditer(response))
    if phrases:
        candidate = _read_after_keyword(response[phrases[-1].end():])
        if candidate:
            return focus_answer(candidate), "answer_phrase"
    line = _last_line(response)
    if _looks_like_answer_line(line):
        candidate = focus_answer(line.rstrip(".").strip(), allow_last_number=False)
        if not _is_wordy(candidate):
            return candidate, "final_line"
    return None, "none"


def last_number(text: str) -> Optional[str]:
    """The last plain number (or ``a/b`` fraction) in ``text``, or None."""
    numbers = _NUMBER_RE.findall(text or "")
    return numbers[-1].rstrip(",").replace(" ", "") if numbers else None
