"""``task=search_hops``: ``task=search_example``'s prompt with all three worked examples in chat turns (a person's
birth year, a city's founding, and a two-hop question answered with two calls: the person, then the city).

Why: with the first two examples (``task=search_examples``) the model learned the one-hop questions but not one
two-hop question (0 of 93 held out: it answers after one call with the person's birth year; docs/environments.md).
The third example shows the second call. Its call prior is 0.92 (``benchmarks/search_call_prior.py``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

from . import search_example

GENERATED = True
GENERATED_FROM = ("search_example",)
"""Recipes whose source the cache digest also reads (the examples live in search_example.py)."""
SHOWN = 3
"""How many of ``search_example.EXAMPLES`` each prompt shows: all of them."""


def build_rows(split: str, data_dir: Optional[Path] = None) -> List[Dict]:
    """``search.build_rows(split)`` with the three examples' turns between the system message and the question."""
    return search_example.rows_with(split, SHOWN, data_dir)
