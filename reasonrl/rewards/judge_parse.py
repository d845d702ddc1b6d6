"""From a judge's answer to a score in [0, 1], read from the judge's *final* verdict in the form its prompt asks for,
and the default prompts that ask for it.

The forms: ``Verdict: <word>`` (parser=verdict, one of ``reward.judge.verdicts``) and ``Score: <n>`` (parser=scale,
``n`` on ``reward.judge.scale``; ``n/high`` and ``n out of high`` are read too, ``high`` being the scale's top). The
label may be left out on the last line (a bare ``no`` or ``7`` there is a verdict too); ``Final verdict``, ``Final
score``, ``Rating``, ``Grade`` and ``Judgment`` are read as labels; markdown emphasis and one trailing period are
ignored.

What counts, so that the policy cannot steer its reward by what it writes (``parse_final``):

- the verdict is the judge's last non-empty line, and that line must be a verdict in the form and nothing else; a
  last line of prose (a quote, a sentence holding a score) is no verdict;
- every other line of the answer that is a labelled verdict in the form must agree with it, else the answer is
  ambiguous (conflicting verdicts);
- a labelled verdict line that is also a line of the response being graded is the policy's text quoted by the judge,
  not the judge's: it is left out (a bare ``yes`` cannot be told apart from the judge's own and is kept).

Anything else (no verdict in the form, conflicting ones, a number off the scale) raises ``Unparsable``: a failed
sample, never a score. ``parse_logprob`` reads the first token's log-probabilities instead (parser=logprob).
"""
from __future__ import annotations

import math
import re
from typing import Any, List, Mapping, Sequence

from .redact import excerpt

_LABEL = r"(?:final\s+)?(?:verdict|score|rating|grade|judge?ment)"
_NUMBER = r"[-+]?\d+(?:\.\d+)?"
_SCALE_VALUE = rf"(?P<value>{_NUMBER})(?:\s*(?:/|out\s+of)\s*(?P<high>{_NUMBER}))?"


class Unparsable(ValueError):
    """The judge's answer holds no verdict the parser can read, or more than one that disagree."""


def _normal(line: str) -> str:
    """A line without markdown emphasis, surrounding blanks and one trailing period (what a form is matched on)."""
    out = line.replace("*", "").replace("`", "").strip().strip("_#").strip()
    return out[:-1].rstrip() if out.endswith((".", "!")) else out


def _form(value: str) -> "re.Pattern[str]":
    return re.compile(rf"(?:(?P<label>{_LABEL})\s*[:=]\s*)?{value}", flags=re.IGNORECASE)


def parse_final(text: str, form: "re.Pattern[str]", score_of, quoted: str = "") -> float:
    """The score of the judge's final verdict in ``text`` (module docstring): ``form`` matches a whole verdict line,
    ``score_of(match)`` gives its score (or raises Unparsable), ``quoted`` is the response being graded."""
    response_lines = {_normal(line).casefold() for line in (quoted or "").splitlines()}
    lines = []
    for line in (text or "").splitlines():
        normal = _normal(line)
        if not normal:
            continue
        match = form.fullmatch(normal)
        if match and match.group("label") and normal.casefold() in response_lines:
            continue  # the response's own line, quoted by the judge
        lines.append((normal, match))
    if not lines:
        raise Unparsable(f"the judge's answer is empty or only quotes the response: {excerpt(text, 160)}")
    last, match = lines[-1]
    if match is None:
        raise Unparsable(f"the judge's last line {excerpt(last, 120)} is not a verdict in the asked form")
    scores = {score_of(m): normal for normal, m in lines[:-1] if m is not None and m.group("label")}
    scores.setdefault(score_of(match), last)
    if len(scores) > 1:
        shown = ", ".join(excerpt(line, 40) for line in scores.values())
        raise Unparsable(f"the judge's answer holds conflicting verdicts ({shown})")
    return score_of(match)


def parse_scale(text: str, low: float, high: float, quoted: str = "") -> float:
    """The judge's final ``Score: n`` (``n``, ``n/high``, ``n out of high``) on the scale [low, high], mapped to
    [0, 1]; Unparsable when there is none in the form, several disagree, ``n`` is off the scale or the ``/high`` is
    not the scale's top."""

    def score_of(match: "re.Match[str]") -> float:
        value = float(match.group("value"))
        if match.group("high") is not None and float(match.group("high")) != high:
            raise Unparsable(f"the judge's score {match.group(0)!r} is not on the scale [{low:g}, {high:g}]")
        if not low <= value <= high:
            raise Unparsable(f"the judge's number {value:g} is off the scale [{low:g}, {high:g}]")
        return (value - low) / (high - low)

    try:
        return parse_final(text, _form(_SCALE_VALUE), score_of, quoted)
    except Unparsable as exc:
        raise Unparsable(f"{exc} (want a last line 'Score: <n>', n in [{low:g}, {high:g}])") from None


def parse_verdict(text: str, verdicts: Mapping[str, float], quoted: str = "") -> float:
    """The score of the judge's final ``Verdict: <word>`` (a word of ``verdicts``, case-insensitive); Unparsable
    when there is none in the form or several disagree."""
    words = {w.strip().casefold(): float(s) for w, s in verdicts.items()}
    alternatives = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
    form = _form(rf"(?P<value>{alternatives})")
    try:
        return parse_final(text, form, lambda m: words[m.group("value").casefold()], quoted)
    except Unparsable as exc:
        raise Unparsable(f"{exc} (want a last line 'Verdict: <one of {sorted(words)}>')") from None


def parse_logprob(top_logprobs: Sequence[Mapping[str, Any]], verdicts: Mapping[str, float]) -> float:
    """Sum over the verdict tokens among the first token's ``top_logprobs`` (``[{"token", "logprob"}]``; a token
    matches a verdict when they are equal after stripping and lower-casing) of p(token) * its score, divided by the
    verdicts' total probability; Unparsable when no verdict token is among them."""
    wanted = {w.strip().lower(): float(s) for w, s in verdicts.items()}
    mass, weighted = 0.0, 0.0
    for entry in top_logprobs or []:
        token = str(entry.get("token", "")).strip().lower()
        logprob = entry.get("logprob")
        if token in wanted and isinstance(logprob, (int, float)) and math.isfinite(logprob):
            p = math.exp(logprob)
            mass += p
            weighted += p * wanted[token]
    if mass <= 0:
        tokens = [e.get("token") for e in (top_logprobs or [])][:8]
        raise Unparsable(f"no verdict token {sorted(wanted)} among the first token's top log-probs "
                         f"{excerpt(tokens, 160)}")
    return weighted / mass


_GRADE = "You are grading an answer to a question.\n\nQuestion:\n{prompt}\n\nReference answer: {ground_truth}\n\n" \
         "Answer to grade:\n{response}\n\n"


def default_template(parser: str, scale: Sequence[float], verdicts: Mapping[str, float]) -> str:
    """The judge prompt used when ``reward.judge.template`` is not set: it asks for the form ``parser`` reads
    (logprob: the verdict word alone, as the first token is what is scored)."""
    words = [w.strip() for w in verdicts]
    if parser == "scale":
        low, high = (f"{float(v):g}" for v in scale)
        return (_GRADE + f"Rate the answer from {low} (wrong) to {high} (fully correct). Reply with exactly one "
                         f"line and nothing else: Score: <a number from {low} to {high}>")
    if parser == "logprob":
        return _GRADE + f"Is the answer correct? Reply with one word: {_either(words)}."
    return (_GRADE + "Is the answer correct? Reply with exactly one line and nothing else: "
            + _either([f"Verdict: {w}" for w in words]))


def _either(options: List[str]) -> str:
    return options[0] if len(options) == 1 else ", ".join(options[:-1]) + " or " + options[-1]

