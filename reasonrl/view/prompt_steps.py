"""One prompt across steps: every logged sample of the same prompt (the sample log records the prompt as text, so the
prompt is its text's key, ``sample_index.prompt_key``), grouped by step with each sample's verdict and reward, and
a word-level diff of two of its responses, computed here with difflib and rendered as HTML (``<del>``/``<ins>``
around the changed words, every piece of text escaped).

The pair diffed by default: the first correct response against the first response of the step logged before it
(what changed when the model got it right); with no correct response, or one in the first step, the first response
of the first step against the first of the last. A response is its turns (``conversation``) when it has them.
"""
from __future__ import annotations

import difflib
import html
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .sample_index import key_from_hex, key_hex
from .sample_query import SampleQuery
from .samples import number_param

WORDS = re.compile(r"\s+|[^\s]+")
"""A response as words and the whitespace between them (both kept, so the diff re-joins to the texts)."""
MAX_SAMPLES = 2000
"""Samples of one prompt listed at most (the latest kept)."""


class UnknownPrompt(LookupError):
    """A prompt key with no sample in the log (indexed so far)."""


def word_diff(old: str, new: str) -> List[Tuple[str, str]]:
    """``old`` -> ``new`` as (op, text) pieces, op one of ``equal``, ``del``, ``ins``; a replaced run of words is
    its ``del`` then its ``ins``. The ``equal`` and ``del`` pieces re-join to ``old``, ``equal`` and ``ins`` to
    ``new``."""
    a, b = WORDS.findall(old), WORDS.findall(new)
    out: List[Tuple[str, str]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(("equal", "".join(a[i1:i2])))
            continue
        if i2 > i1:
            out.append(("del", "".join(a[i1:i2])))
        if j2 > j1:
            out.append(("ins", "".join(b[j1:j2])))
    return out


def diff_html(pieces: Sequence[Tuple[str, str]]) -> str:
    """The diff as escaped text with ``<del>`` and ``<ins>`` spans."""
    tags = {"del": "<del>{}</del>", "ins": "<ins>{}</ins>", "equal": "{}"}
    return "".join(tags[op].format(html.escape(text, quote=False)) for op, text in pieces)


def response_text(row: Mapping[str, Any]) -> str:
    return str(row.get("conversation") or row.get("response") or "")


def default_pair(samples: Sequence[Dict[str, Any]]) -> Optional[Tuple[int, int]]:
    """The positions of the (before, after) pair diffed when none is asked for; None with fewer than 2 samples."""
    if len(samples) < 2:
        return None
    steps = sorted({s["step"] for s in samples})
    first_of = {}
    for s in samples:
        first_of.setdefault(s["step"], s["position"])
    correct = next((s for s in samples if s["verdict"] == "correct"), None)
    if correct is not None and correct["step"] != steps[0]:
        before = steps[steps.index(correct["step"]) - 1]
        return first_of[before], correct["position"]
    if len(steps) > 1:
        return first_of[steps[0]], first_of[steps[-1]]
    return samples[0]["position"], samples[1]["position"]


def _position(params: Mapping[str, str], key: str, listed: Dict[int, Dict[str, Any]]) -> Optional[int]:
    value = number_param(params, key)
    if value is None:
        return None
    if not value.is_integer() or int(value) not in listed:
        raise ValueError(f"parameter {key}={params[key]!r} is not a sample of this prompt (use a listed position)")
    return int(value)


def prompt_across_steps(query: SampleQuery, params: Mapping[str, str]) -> Dict[str, Any]:
    """``/api/prompt?run=I&key=K[&a=P&b=P]``: the samples of prompt ``K`` by step and the word diff of the samples
    at positions ``a`` (before) and ``b`` (after), by default ``default_pair``. ValueError names a bad parameter,
    UnknownPrompt an unknown prompt."""
    key_text = params.get("key") or ""
    try:
        key = key_from_hex(key_text)
    except ValueError:
        raise ValueError(f"parameter key={key_text!r} is not a prompt key (16 hex digits, a sample's prompt_key)")
    index = query.index
    index.refresh()
    with index.lock:
        keys, verdicts = index.prompt_keys, index.columns["verdict"]
        positions = [i for i in range(len(keys)) if keys[i] == key][-MAX_SAMPLES:]
        names = index.codes["verdict"].names
        samples = [{"position": i, "step": index.steps[i], "verdict": names[verdicts[i]],
                    "reward": None if index.rewards[i] != index.rewards[i] else index.rewards[i],
                    "length": index.lengths[i]} for i in positions]
        progress = index.progress()
    if not samples:
        raise UnknownPrompt(f"no sample of prompt {key_text} in the sample log" +
                          (" indexed so far" if progress["building"] else ""))
    listed = {s["position"]: s for s in samples}
    a, b = _position(params, "a", listed), _position(params, "b", listed)
    pair = (a, b) if a is not None and b is not None else default_pair(samples)
    by_step: Dict[int, List[Dict[str, Any]]] = {}
    for s in samples:
        by_step.setdefault(s["step"], []).append(s)
    steps = [{"step": k, "samples": v} for k, v in sorted(by_step.items())]
    out: Dict[str, Any] = {"key": key_hex(key), "steps": steps,
                           "samples": len(samples), "pair": None, "indexing": progress}
    first = query.read_rows([positions[0]])
    out["prompt"] = first[0].get("prompt") if first else None
    if pair is not None:
        rows = query.read_rows(list(pair))
        if len(rows) == 2:
            pieces = word_diff(response_text(rows[0]), response_text(rows[1]))
            out["pair"] = {"a": listed[pair[0]], "b": listed[pair[1]], "diff": [list(p) for p in pieces],
                           "diff_html": diff_html(pieces), "a_row": rows[0], "b_row": rows[1]}
    return out
