"""math_tool recipe: GSM8K and MATH problems with a system message that explains the Python tool (``task=math_tool``,
docs/tools.md). The rows are the gsm8k and math recipes' rows (same data_source, ground truth and verifier), each
prompt preceded by the tool's system prompt.

- ``train``: GSM8K train, plus the MATH train split when its file is there (``math_train.jsonl``; see ``math.py``).
- ``test``: GSM8K test and MATH-500.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, List, Optional

from reasonrl.tools.python import SYSTEM_PROMPT

from . import gsm8k, math

log = logging.getLogger(__name__)


def with_tool_prompt(row: Dict) -> Dict:
    """``row`` with the tool's system message first (an existing system message is replaced)."""
    user = [m for m in row["prompt"] if m["role"] != "system"]
    return {**row, "prompt": [{"role": "system", "content": SYSTEM_PROMPT}] + user}


def build_rows(split: str, data_dir: Optional[Path]) -> List[Dict]:
    if split not in ("train", "test"):
        raise ValueError(f"math_tool has splits ['test', 'train'], not {split!r}")
    rows = gsm8k.build_rows(split, data_dir)
    try:
        rows += math.build_rows(split, data_dir)
    except FileNotFoundError as exc:
        if split == "test":
            raise
        log.warning("math_tool train: GSM8K only (%s)", exc)
    return [with_tool_prompt(r) for r in rows]
