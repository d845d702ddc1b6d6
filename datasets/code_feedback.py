"""code_feedback recipe: MBPP (``mbpp.py``, the same upstream file and splits) in turns, for the ``code_feedback``
environment (``task=code_feedback``, docs/environments.md): each row names the environment, and its system message
says that every closed ```python block is run against the tests and the failures come back."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

from . import mbpp

SYSTEM = ("Solve the programming task in Python. Each time you close a ```python code block, the tests run on it "
          "and you see which failed, in a ```output block; fix the code and submit again in a new ```python block "
          "until every test passes. Your last code block is your answer.")
SPLITS = mbpp.SPLITS


def in_turns(row: Dict) -> Dict:
    """An MBPP row for the code_feedback environment."""
    user = [m for m in row["prompt"] if m["role"] != "system"]
    return {**row, "prompt": [{"role": "system", "content": SYSTEM}] + user, "environment": "code_feedback"}


def build_rows(split: str, data_dir: Optional[Path]) -> List[Dict]:
    return [in_turns(r) for r in mbpp.build_rows(split, data_dir)]
