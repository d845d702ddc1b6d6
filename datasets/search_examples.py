"""``task=search_examples``: ``task=search_example``'s prompt with more worked examples in chat turns (the first
``SHOWN`` of ``search_example.EXAMPLES``: a person's birth year, a city's founding, a two-hop question with two calls),
each ending with the year in ``\\boxed{}``.

Why: with one example the base model calls the tool at times but after the tool's answer seldom writes the year in
``\\boxed{}``, so GRPO saw almost no reward (docs/environments.md, "Eliciting the call"). ``SHOWN`` was chosen by the
call prior ``benchmarks/search_call_prior.py`` measures.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

from . import search_example

GENERATED = True
GENERATED_FROM = ("search_example",)
"""Recipes whose source the cache digest also reads (the examples live in search_example.py)."""
SHOWN = 2
"""How many of ``search_example.EXAMPLES`` each prompt shows."""


def build_rows(split: str, data_dir: Optional[Path] = None) -> List[Dict]:
    """``search.build_rows(split)`` with the first ``SHOWN`` examples' turns between the system message and the
    question."""
    return search_example.rows_with(split, SHOWN, data_dir)
