"""``task=search_example``: the ``search`` task's questions (``reasonrl.datasets.search``: same world, corpus, splits
and answers) after one worked example of the tool in chat turns: a user question, the assistant's
``<tool_call>{"name": "search", ...}</tool_call>``, the tool's answer and the assistant's year in ``\\boxed{}``.

Why: with ``task=search``'s instruction alone SmolLM2-135M-Instruct never wrote a call (docs/environments.md,
"Evidence"), so GRPO had no reward signal to follow; the same example written as text in the system message did
little better (``benchmarks/search_call_prior.py``). The example's person is not in the corpus, so it gives away no
answer.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional

from . import search

GENERATED = True  # from code alone (the cache digest reads this module only, not search.py)
EXAMPLE_NAME = "Zorbel Quintax"
"""The worked example's person: not a name the corpus can hold (its syllables are not in ``search.SYLLABLES``)."""
EXAMPLE_ARTICLE = f"{EXAMPLE_NAME} is a brewer, born in the year 1834 in the city of Qualdor."
EXAMPLE = [
    {"role": "user", "content": f"In what year was {EXAMPLE_NAME} born?"},
    {"role": "assistant",
     "content": "<tool_call>" + json.dumps({"name": "search", "arguments": {"query": EXAMPLE_NAME}}) + "</tool_call>"},
    {"role": "tool", "content": f"1. {EXAMPLE_NAME}: {EXAMPLE_ARTICLE}"},
    {"role": "assistant", "content": f"{EXAMPLE_NAME} was born in \\boxed{{1834}}."},
]
"""The turns shown before each question (in the tool turn's text as the ``search`` environment writes it)."""


def build_rows(split: str, data_dir: Optional[Path] = None) -> List[Dict]:
    """``search.build_rows(split)`` with ``EXAMPLE``'s turns between the system message and the question."""
    rows = search.build_rows(split, data_dir)
    for row in rows:
        system, question = row["prompt"][0], row["prompt"][-1]
        row["prompt"] = [system, *(dict(m) for m in EXAMPLE), question]
    return rows
