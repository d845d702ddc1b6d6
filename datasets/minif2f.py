"""miniF2F (Lean 4) recipe: ``<data_dir>/minif2f_lean4_{valid,test}.jsonl`` -> schema rows checked by the lean verifier.

Upstream rows (yangky11/miniF2F-lean4, see shared/data/README.md) hold ``name``, ``split``, ``header``
(``import Mathlib`` + options + ``open``) and ``formal_statement`` (the theorem, ending in ``:= by``). The
ground truth is the formal statement; the header travels in ``extra_info`` and becomes the REPL environment
the proof is checked in. A pure row builder: writing parquet and the lookup order live in ``common.py``.
"""
from __future__ import annotations

from .common import read_jsonl
from pathlib import Path
from typing import Any, Dict, List, Optional

UPSTREAM = {"valid": "minif2f_lean4_valid.jsonl", "test": "minif2f_lean4_test.jsonl"}
SPLIT_ALIASES = {"val": "valid", "validation": "valid"}
INSTRUCTION = ("Complete the following Lean 4 theorem. Write the whole theorem with its proof in one ```lean4 code "
               "block; do not change the statement and do not use sorry.")


def render_prompt(header: str, formal_statement: str) -> str:
    """The user message: the instruction, then the header and statement in a lean4 block."""
    return f"{INSTRUCTION}\n\n```lean4\n{header.rstrip()}\n\n{formal_statement.rstrip()}\n```"


def build_row(record: Dict[str, Any], split: str, index: int) -> Dict[str, Any]:
    """One schema row from one upstream record."""
    for key in ("name", "header", "formal_statement"):
        if not isinstance(record.get(key), str):
            raise ValueError(f"miniF2F {split} row {index}: missing string field {key!r}")
    statement = record["formal_statement"]
    return {
        "data_source": "minif2f",
        "prompt": [{"role": "user", "content": render_prompt(record["header"], statement)}],
        "ability": "theorem_proving",
        "reward_model": {"style": "rule", "ground_truth": statement},
        "extra_info": {"split": split, "index": index, "name": record["name"], "header": record["header"]},
        "verifier": "lean",
    }


def build_rows(split: str, data_dir: Optional[Path]) -> List[Dict[str, Any]]:
    """Rows of ``split`` ("valid" or "test"; "val" means "valid") from ``data_dir``.

    Raises FileNotFoundError when ``data_dir`` is None (miniF2F is not read from the Hub) or lacks the file."""
    split = SPLIT_ALIASES.get(split, split)
    if split not in UPSTREAM:
        raise ValueError(f"miniF2F has splits {sorted(UPSTREAM)}, not {split!r}")
    if data_dir is None:
        raise FileNotFoundError(f"miniF2F is read from {UPSTREAM[split]} in REASONRL_DATA_DIR (no Hub source)")
    path = Path(data_dir) / UPSTREAM[split]
    if not path.exists():
        raise FileNotFoundError(f"{path} not found (miniF2F Lean 4 jsonl from yangky11/miniF2F-lean4)")
    return [build_row(record, split, i) for i, record in enumerate(read_jsonl(path))]
