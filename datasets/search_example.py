"""``task=search_example``: the ``search`` task's questions (``reasonrl.datasets.search``: same world, corpus, splits
and answers) after one worked example of the tool in chat turns: a user question, the assistant's
``<tool_call>{"name": "search", ...}</tool_call>``, the tool's answer and the assistant's year in ``\\boxed{}``.

Why: with ``task=search``'s instruction alone SmolLM2-135M-Instruct never wrote a call (docs/environments.md,
"Evidence"), so GRPO had no reward signal to follow; the same example written as text in the system message did
little better (``benchmarks/search_call_prior.py``). The example's person is not in the corpus, so it gives away no
answer.

How many worked examples a task shows is its recipe's module-level ``SHOWN`` (the first ``SHOWN`` of ``EXAMPLES``):
1 here; ``task=search_examples`` (``datasets/search_examples.py``) shows more through ``rows_with``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import search

GENERATED = True  # from code alone (the cache digest reads this module only, not search.py)
SHOWN = 1
"""How many of ``EXAMPLES`` ``task=search_example``'s prompts show."""


def _call(query: str) -> Dict[str, str]:
    return {"role": "assistant",
            "content": "<tool_call>" + json.dumps({"name": "search", "arguments": {"query": query}}) + "</tool_call>"}


def _found(title: str, article: str) -> Dict[str, str]:
    return {"role": "tool", "content": f"1. {title}: {article}"}  # as the search environment writes a hit


EXAMPLE_NAME = "Zorbel Quintax"
"""The worked example's person: not a name the corpus can hold (its syllables are not in ``search.SYLLABLES``)."""
EXAMPLE_ARTICLE = f"{EXAMPLE_NAME} is a brewer, born in the year 1834 in the city of Qualdor."
EXAMPLE = [
    {"role": "user", "content": f"In what year was {EXAMPLE_NAME} born?"},
    _call(EXAMPLE_NAME),
    _found(EXAMPLE_NAME, EXAMPLE_ARTICLE),
    {"role": "assistant", "content": f"{EXAMPLE_NAME} was born in \\boxed{{1834}}."},
]
"""The turns shown before each question (in the tool turn's text as the ``search`` environment writes it)."""

CITY_NAME = "Qualdor"
"""The second example's city (the first example's birthplace; not a name the corpus can hold)."""
CITY_ARTICLE = f"{CITY_NAME} is a city. It was founded in the year 1612."
CITY_EXAMPLE = [
    {"role": "user", "content": f"In what year was the city of {CITY_NAME} founded?"},
    _call(CITY_NAME),
    _found(CITY_NAME, CITY_ARTICLE),
    {"role": "assistant", "content": f"The city of {CITY_NAME} was founded in \\boxed{{1612}}."},
]
"""A one-hop city question, as ``search``'s city questions are asked."""

HOP_PERSON, HOP_CITY = "Mippa Trondle", "Hoskarn"
"""The third example's person and her city (names the corpus cannot hold)."""
HOP_ARTICLES = (f"{HOP_PERSON} is a weaver, born in the year 1790 in the city of {HOP_CITY}.",
                f"{HOP_CITY} is a city. It was founded in the year 1255.")
HOP_EXAMPLE = [
    {"role": "user", "content": f"In what year was the city where {HOP_PERSON} was born founded?"},
    _call(HOP_PERSON),
    _found(HOP_PERSON, HOP_ARTICLES[0]),
    _call(HOP_CITY),
    _found(HOP_CITY, HOP_ARTICLES[1]),
    {"role": "assistant", "content": f"{HOP_PERSON} was born in {HOP_CITY}, which was founded in \\boxed{{1255}}."},
]
"""A two-hop question: two calls (the person, then the city), then the year."""

EXAMPLES: Tuple[List[Dict[str, str]], ...] = (EXAMPLE, CITY_EXAMPLE, HOP_EXAMPLE)
"""The worked examples, in the order they are shown; each ends with the year in ``\\boxed{}``."""
NAMES = (EXAMPLE_NAME, CITY_NAME, HOP_PERSON, HOP_CITY)
"""Every name the examples use (none can be in the corpus)."""


def shown_turns(shown: int) -> List[Dict[str, str]]:
    """The first ``shown`` examples' turns, in order (fresh dicts)."""
    if not 1 <= shown <= len(EXAMPLES):
        raise ValueError(f"shown must be 1..{len(EXAMPLES)}, not {shown}")
    return [dict(m) for example in EXAMPLES[:shown] for m in example]


def rows_with(split: str, shown: int, data_dir: Optional[Path] = None) -> List[Dict]:
    """``search.build_rows(split)`` with the first ``shown`` examples' turns between the system message and the
    question."""
    rows = search.build_rows(split, data_dir)
    for row in rows:
        system, question = row["prompt"][0], row["prompt"][-1]
        row["prompt"] = [system, *shown_turns(shown), question]
    return rows


def build_rows(split: str, data_dir: Optional[Path] = None) -> List[Dict]:
    """``search.build_rows(split)`` with ``EXAMPLE``'s turns between the system message and the question."""
    return rows_with(split, SHOWN, data_dir)
