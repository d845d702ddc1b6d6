"""Reading the final answer out of a model response.

The order follows what models are asked to write: the last ``\\boxed{...}`` (or ``\\fbox{...}``), then a
GSM8K ``#### answer`` line, then a phrase such as "the answer is ...", then a short final line that looks
like an answer. Nested braces are matched. A response whose last box never closes was cut off: it has no
answer (``extract_answer``); only a gold's unclosed box (``last_boxed``) is read to the end of the text.
Pure string work: no sympy, no math-verify, so it is fast and cannot hang.
"""
from __future__ import annotations

import re
from typing import List, Optional, Tuple

BOX_COMMANDS = ("\\boxed", "\\fbox")
"""LaTeX commands whose argument is taken as the final answer."""

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
_JOINABLE_GAP = 40
"""Boxes separated by at most this much connecting text form one answer list (see ``_CONNECTOR_RE``)."""
_CONNECTOR_RE = re.compile(
    r"^(?:\s|[,;$]|\\q?quad|\\[,;:!]|\\[()\[\]]|\\text\{[^{}]*\}|\band\b|\bor\b|"
    r"[a-zA-Z](?:_\{?\w+\}?)?\s*=)*$")
"""Only separators, "and"/"or", \\text{...} notes and ``x_2 =`` labels may stand between joined boxes."""


def _read_braced(text: str, open_at: int) -> Tuple[str, bool]:
    """The content of the brace group opening at ``text[open_at] == '{'`` and whether it was closed."""
    depth = 0
    for i in range(open_at, len(text)):
        ch = text[i]
        if ch == "\\":  # skip escaped braces such as \{ and \}
            continue
        if ch == "{" and (i == 0 or text[i - 1] != "\\"):
            depth += 1
        elif ch == "}" and text[i - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[open_at + 1:i], True
    return text[open_at + 1:], False


def _boxes(text: str) -> List[Tuple[int, int, str, bool]]:
    """``(start, end, content, closed)`` of every ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed x``, in order."""
    found: List[Tuple[int, int, str, bool]] = []
    for command in BOX_COMMANDS:
        start = 0
        while True:
            at = text.find(command, start)
            if at < 0:
                break
            after = at + len(command)
            start = after
            if after < len(text) and text[after].isalpha():  # \boxedfoo is another command
                continue
            rest = text[after:]
            stripped = rest.lstrip()
            offset = after + (len(rest) - len(stripped))
            if stripped.startswith("{"):
                content, closed = _read_braced(text, offset)
                end = offset + len(content) + (2 if closed else 1)
            elif stripped[:1] and stripped[:1] not in "$\\":  # "\boxed 5" form: up to the next space/$
                content = re.split(r"[\s$]", stripped, maxsplit=1)[0]
                end, closed = offset + len(content), True
            else:
                continue
            found.append((at, end, content.strip(), closed))
    found.sort(key=lambda box: box[0])
    return found


def boxed_contents(text: str) -> List[str]:
    """All box arguments in ``text`` in order of appearance."""
    return [content for _start, _end, content, _closed in _boxes(text)]


def last_boxed(text: str) -> Optional[str]:
    """The content of the last box in ``text``, or None.

    Boxes written as one list at the end (``\\boxed{1}, \\boxed{2} and \\boxed{3}``: gaps of at most
    ``_JOINABLE_GAP`` characters without a blank line) are joined as ``1, 2, 3``.
    """
    boxes = _boxes(text)
    if not boxes:
        return None
    run = [boxes[-1]]
    for box in reversed(boxes[:-1]):
        gap = text[box[1]:run[0][0]]
        if len(gap) > _JOINABLE_GAP or "\n\n" in gap or box[1] > run[0][0] or not _CONNECTOR_RE.match(gap):
            break
        run.insert(0, box)
    contents = [content for _start, _end, content, _closed in run if content]
    return ", ".join(contents) if contents else None


def _last_box(text: str) -> Tuple[int, bool]:
    """Where the last box starts (-1: no box) and whether every box closes (an unclosed one runs to the end of
    the text, so it holds every later box)."""
    boxes = _boxes(text)
    return (boxes[-1][0] if boxes else -1), all(box[3] for box in boxes)


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
        chunks = [chunk.strip() for chunk in re.split(r"[^\x00-\x7f]+", candidate) if chunk.strip(" .,:;")]
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
    if not line:
        return False
    has_math = any(ch.isdigit() for ch in line) or "\\" in line or "$" in line
    if not has_math:
        return len(line) <= 20 and len(line.split()) <= 3
    limit = _FINAL_LINE_MAX_CHARS if _is_wordy(line) else _FINAL_LINE_MAX_LATEX_CHARS
    return len(line) <= limit


def extract_answer(response: str) -> Tuple[Optional[str], str]:
    """``(answer_text, method)``; ``(None, "none")`` when the response states no answer.

    ``method`` is one of ``boxed``, ``gsm8k``, ``answer_phrase``, ``final_line``, ``none``. A "final answer
    is ..." phrase written after the last box wins over the box. ``(None, "unclosed_box")``: the last box never
    closes, so the response was cut off inside its answer (whatever it holds is not a stated answer).
    """
    if not isinstance(response, str) or not response.strip():
        return None, "none"
    box_start, boxes_closed = _last_box(response)
    if not boxes_closed:
        return None, "unclosed_box"
    final_phrases = list(_FINAL_ANSWER_RE.finditer(response))
    if final_phrases and final_phrases[-1].start() > box_start:
        candidate = _read_after_keyword(response[final_phrases[-1].end():])
        if candidate:
            return focus_answer(candidate), "answer_phrase"
    boxed = last_boxed(response) if box_start >= 0 else None
    if boxed:
        return boxed, "boxed"
    hashes = _HASH_RE.findall(response)
    if hashes and hashes[-1].strip():
        return _read_after_keyword(hashes[-1]) or hashes[-1].strip(), "gsm8k"
    phrases = list(_ANSWER_KEYWORD_RE.finditer(response))
    if phrases:
        candidate = _read_after_keyword(response[phrases[-1].end():])
        if candidate:
            return focus_answer(candidate), "answer_phrase"
    lines = [line.strip() for line in response.strip().split("\n") if line.strip()]
    if lines and _looks_like_answer_line(lines[-1]):
        candidate = focus_answer(lines[-1].rstrip(".").strip(), allow_last_number=False)
        if not _is_wordy(candidate):
            return candidate, "final_line"
    return None, "none"


def last_number(text: str) -> Optional[str]:
    """The last plain number (or ``a/b`` fraction) in ``text``, or None."""
    numbers = _NUMBER_RE.findall(text or "")
    return numbers[-1].rstrip(",").replace(" ", "") if numbers else None
