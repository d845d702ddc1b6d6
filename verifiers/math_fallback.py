"""The answer of a response that marks none (no box, no ``####``, no "the answer is"): its final statement.

GSM8K's "flexible" scoring credits the last number of such a response. Read literally that is a reward hack:
a response that never commits to an answer but lists numbers (``1, 2, 3, ..., 72``), or stops in the middle
of its working, is credited whenever its last number happens to be the gold. So the fallback reads only the
final statement and only when it states one value:

1. the text after the last chat-template token (``<|im_start|>user``, ``</s>``) is dropped;
2. the final statement is the last sentence (sentences end at a line break, at ``. ! ?`` followed by a
   space, also after a closing ``$``/``$$``, or at ``。 ！ ？ ।``) that holds a digit;
3. within it, the answer region is its ``**bold**`` parts holding a digit, else what follows the last
   ``=``, "equals" or conclusion word ("so", "thus", "therefore", "hence": ``48 + 24 = 72 apples``,
   "she had 48 and got 24, so she has 72"), else the whole sentence;
4. the region may hold at most ``MAX_NUMBERS`` different numbers; its last one is the answer. More than that
   is a list, not an answer: nothing is credited.

So "... so she has 72 apples." and "48 + 24 = 72" are read as 72, "One of 10, 20, 30, 72" is not read.
"""
from __future__ import annotations

import re
from typing import Optional, Tuple

MAX_NUMBERS = 2
"""Most different numbers the answer region of a final statement may hold ("After 3 days she has 72 apples")."""
TAIL_CHARS = 4000
"""Only the end of a response is read (bounded cost)."""
_CHAT_TOKEN_RE = re.compile(r"<\|[A-Za-z_]{1,30}\|>|</s>|<eos>")
_SENTENCE_END_RE = re.compile(r"\n|[.!?](?:\$\$?|\\[\])])?(?=\s)|[。！？।]")
"""A sentence ends at a line break, at ". ! ?" (or ".$$", ".\\]") before a space, or at a CJK/Devanagari stop."""
_EQUALS_RE = re.compile(r"=|\b(?:equals|is equal to|so|thus|therefore|hence)\b", re.IGNORECASE)
"""What a stated value follows: ``=``, "equals", or a conclusion word ("..., so she has 72 apples")."""
_BOLD_RE = re.compile(r"\*\*([^*]{1,200})\*\*")
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")


def strip_chat_tokens(text: str) -> str:
    """``text`` up to its first chat-template token (a model that ran on into the next turn)."""
    match = _CHAT_TOKEN_RE.search(text)
    return text[:match.start()] if match else text


def final_statement(text: str) -> Optional[str]:
    """The last sentence of ``text`` that holds a digit, or None (see the module docstring)."""
    text = strip_chat_tokens(text[-TAIL_CHARS:]).replace("\u2212", "-")
    end = len(text)
    bounds = [match.end() for match in _SENTENCE_END_RE.finditer(text)]
    for start in reversed([0] + bounds):
        sentence = text[start:end]
        if any(ch.isdigit() for ch in sentence):
            return sentence.strip()
        end = start
    return None


def answer_region(sentence: str) -> str:
    """The part of a final statement that states its value: its bold parts holding a digit, or what follows its
    last ``=``/"equals"/conclusion word, or the sentence itself."""
    bold = [match.group(1) for match in _BOLD_RE.finditer(sentence) if any(ch.isdigit() for ch in match.group(1))]
    if bold:  # all of them: "**70**, **71**, **72**" is a list too
        return " ".join(bold)
    equals = list(_EQUALS_RE.finditer(sentence))
    if equals:
        return sentence[equals[-1].end():]
    return sentence


def final_number(text: str) -> Tuple[Optional[str], str]:
    """``(number, why)``: the number the final statement of ``text`` states, or ``(None, reason)``."""
    sentence = final_statement(text)
    if sentence is None:
        return None, "no number in the response"
    numbers = [number.rstrip(",").replace(" ", "") for number in _NUMBER_RE.findall(answer_region(sentence))]
    if not numbers:  # "= x" with the digits before the "="
        return None, "the final statement states no number"
    distinct = len({number.replace(",", "") for number in numbers})  # "25, which is 25%" states one value
    if distinct > MAX_NUMBERS:
        return None, (f"no stated answer: the final statement lists {distinct} numbers "
                      f"(more than {MAX_NUMBERS} is a list, not an answer)")
    return numbers[-1], "the number the final statement states"
