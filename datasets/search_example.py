"""``task=search_example``: the ``search`` task's questions (``reasonrl.datasets.search``: same world, corpus, splits
and answers) with a system message that shows one worked example of the call format: a
``<tool_call>{"name": "search", ...}</tool_call>`` turn, the tool's answer and the final answer in ``\\boxed{}``.

Why: with ``task=search``'s instruction alone, SmolLM2-135M-Instruct never wrote a call (docs/environments.md,
"Evidence"), so GRPO had no reward signal to follow. The example uses a name that is not in the corpus, so it gives
away no answer.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

from . import search

GENERATED = True  # from code alone (the cache digest reads this module only, not search.py)
EXAMPLE_NAME = "Zorbel Quintax"
"""The worked example's person: not a name the corpus can hold (its syllables are not in ``search.SYLLABLES``)."""
SYSTEM = (
    "Answer the question using the search tool: the facts are in a private encyclopedia that you cannot know "
    "otherwise. First call the tool with the name from the question, then give the year within \\boxed{}.\n\n"
    "Example.\n"
    f"User: In what year was {EXAMPLE_NAME} born?\n"
    f'Assistant: <tool_call>{{"name": "search", "arguments": {{"query": "{EXAMPLE_NAME}"}}}}</tool_call>\n'
    f"Tool: 1. {EXAMPLE_NAME}: {EXAMPLE_NAME} is a brewer, born in the year 1834 in the city of Qualdor.\n"
    f"Assistant: {EXAMPLE_NAME} was born in \\boxed{{1834}}.")


def build_rows(split: str, data_dir: Optional[Path] = None) -> List[Dict]:
    """``search.build_rows(split)`` with ``SYSTEM`` as each row's system message."""
    rows = search.build_rows(split, data_dir)
    for row in rows:
        row["prompt"] = [{"role": "system", "content": SYSTEM}] + [m for m in row["prompt"] if m["role"] != "system"]
    return rows
