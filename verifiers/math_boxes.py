"""Finding ``\\boxed{...}`` / ``\\fbox{...}`` answers in a response, in time linear in its length.

Why linear: one regex pass finds every box command, one pass over the text pairs every ``{`` with its ``}``
(a stack: each brace is pushed and popped at most once), and a box is kept as indices into the text, never as
a copy of its content. Reading a box's content is then a single slice, and only the boxes an answer is made of
are sliced (those are disjoint, so all slices together are at most the text's length). The earlier version
scanned from every ``\\boxed{`` to its closing brace, so a response of repeated ``\\boxed{`` (which never
close) cost a scan to the end of the text per opening: quadratic, minutes for 200 KB.
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Dict, List, Optional

BOX_COMMANDS = ("\\boxed", "\\fbox")
"""LaTeX commands whose argument is taken as the final answer."""

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")  # \boxedfoo is another command
_SPACES_RE = re.compile(r"\s*")
_BARE_ARGUMENT_STOP_RE = re.compile(r"[\s$]")
JOINABLE_GAP = 40
"""Boxes separated by at most this much connecting text form one answer list (see ``_CONNECTOR_RE``)."""
_CONNECTOR_RE = re.compile(
    r"(?:[ \t\r]|[,;$]|\\q?quad|\\[,;:!]|\\[()\[\]]|\\text\{[^{}]*\}|\band\b|\bor\b|"
    r"[a-zA-Z](?:_\{?\w+\}?)?[ \t]*=)*")
"""Only separators, "and"/"or", \\text{...} notes and ``x_2 =`` labels may stand between joined boxes; a line
break ends a list (a box on an earlier line is an earlier answer, e.g. an echoed example's)."""


@dataclass(frozen=True)
class Box:
    """One box command found in a text, as indices into that text."""

    start: int
    """Where the command (``\\boxed``) starts."""
    content_start: int
    """Where the argument starts (after ``{``, or the first character of a bare ``\\boxed 5`` argument)."""
    content_end: int
    """Where the argument ends (the closing ``}``; the end of the text for a box that never closes)."""
    end: int
    """Just after the box (after its ``}``)."""
    closed: bool
    """Whether the argument's brace group closes."""

    def content(self, text: str) -> str:
        """The argument's text, stripped."""
        return text[self.content_start:self.content_end].strip()


def brace_partners(text: str) -> Dict[int, int]:
    """``{open index: close index}`` for every brace pair of ``text`` (one pass with a stack).

    A brace right after a backslash (``\\{``, ``\\}``) is an escaped brace, not a group; an opening brace
    that never closes is absent from the result.
    """
    partners: Dict[int, int] = {}
    stack: List[int] = []
    for match in re.finditer(r"[{}]", text):
        at = match.start()
        if at and text[at - 1] == "\\":
            continue
        if text[at] == "{":
            stack.append(at)
        elif stack:
            partners[stack.pop()] = at
    return partners


def find_boxes(text: str) -> List[Box]:
    """Every ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed x`` of ``text``, in order of appearance."""
    found: List[Box] = []
    partners: Optional[Dict[int, int]] = None
    bare_stops: Optional[List[int]] = None
    for match in _BOX_RE.finditer(text):
        offset = _SPACES_RE.match(text, match.end()).end()
        if offset >= len(text):
            continue
        if text[offset] == "{":
            if partners is None:
                partners = brace_partners(text)
            close = partners.get(offset)
            if close is None:
                found.append(Box(match.start(), offset + 1, len(text), len(text), False))
            else:
                found.append(Box(match.start(), offset + 1, close, close + 1, True))
        elif text[offset] not in "$\\":  # "\boxed 5" form: up to the next space or $
            if bare_stops is None:
                bare_stops = [stop.start() for stop in _BARE_ARGUMENT_STOP_RE.finditer(text)]
            index = bisect.bisect_left(bare_stops, offset)
            stop = bare_stops[index] if index < len(bare_stops) else len(text)
            found.append(Box(match.start(), offset, stop, stop, True))
    return found


def boxed_contents(text: str) -> List[str]:
    """All box arguments in ``text`` in order of appearance."""
    return [box.content(text) for box in find_boxes(text)]


def last_box_run(text: str, boxes: List[Box]) -> List[Box]:
    """The last box and the boxes before it that are written as one list with it (``\\boxed{1}, \\boxed{2}
    and \\boxed{3}``: gaps of at most ``JOINABLE_GAP`` characters on one line, only connectors between)."""
    if not boxes:
        return []
    run = [boxes[-1]]  # built backwards, from the last box
    for box in reversed(boxes[:-1]):
        first = run[-1]
        if box.end > first.start or first.start - box.end > JOINABLE_GAP:  # nested in it, or too far
            break
        if not _CONNECTOR_RE.fullmatch(text[box.end:first.start]):
            break
        run.append(box)
    return run[::-1]


def last_boxed(text: str) -> Optional[str]:
    """The content of the last box in ``text`` (a list of boxes joined as ``1, 2, 3``), or None."""
    contents = [box.content(text) for box in last_box_run(text, find_boxes(text))]
    contents = [content for content in contents if content]
    return ", ".join(contents) if contents else None
