"""Shared recipe machinery: the row schema, writing/reading parquet, and where a task's data comes from.

Lookup order for a task's split (issue 2): explicit files -> prepared parquet in the cache -> upstream files in
``REASONRL_DATA_DIR`` -> the Hugging Face Hub when online -> an error naming the one command that prepares the data.
A recipe module (``reasonrl.datasets.<name>``) exposes ``build_rows(split, data_dir) -> list[dict]``; with
``data_dir=None`` it may read the Hub, and raises FileNotFoundError when it cannot find its source.

A generated recipe (``GENERATED = True``: made from code alone) is cached with a digest of its module's source beside
it (``<split>.parquet.source``); a cached split whose digest differs, or has none, is built again, so a changed
generator (countdown's levels, say) is never answered with the old rows.
"""
from __future__ import annotations

import hashlib
import inspect
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from reasonrl.registry import Registry, UnknownName

REQUIRED_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")


class DataError(ValueError):
    """A dataset file or row that does not follow the schema."""


def cache_dir() -> Path:
    return Path(os.environ.get("REASONRL_CACHE", Path.home() / ".cache" / "reasonrl")) / "data"


def data_dir_from_env() -> Optional[Path]:
    value = os.environ.get("REASONRL_DATA_DIR")
    return Path(value) if value else None


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def check_row(row: Any, where: str) -> None:
    """Raise DataError naming ``where`` (file and row index) when ``row`` breaks the schema."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a mapping, got {type(row).__name__}")
    missing = [c for c in REQUIRED_COLUMNS if c not in row]
    if missing:
        raise DataError(f"{where}: missing column(s) {', '.join(missing)}")
    prompt = row["prompt"]
    if isinstance(prompt, str) or not isinstance(prompt, (list, tuple)) or not prompt:
        raise DataError(f"{where}: 'prompt' must be a non-empty list of chat messages")
    for j, msg in enumerate(prompt):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str) or not isinstance(msg.get("content"), str):
            raise DataError(f"{where}: prompt message {j} needs string 'role' and 'content'")
        if not msg["content"].strip():
            raise DataError(f"{where}: prompt message {j} has an empty 'content'")
    rm = row["reward_model"]
    if not isinstance(rm, dict) or rm.get("ground_truth") is None:
        raise DataError(f"{where}: 'reward_model' must hold a 'ground_truth'")
    truth = rm["ground_truth"]
    if (isinstance(truth, str) and not truth.strip()) or (isinstance(truth, (list, tuple, dict)) and not truth):
        raise DataError(f"{where}: 'reward_model.ground_truth' is empty (every response would be scored against "
                        f"nothing)")


def read_jsonl(path) -> List[Dict[str, Any]]:
    """The records of an upstream JSON Lines file (blank lines skipped); FileNotFoundError when it is missing,
    ValueError naming the line when one is not valid JSON."""
    import json

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found")
    records = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}: line {i + 1}: not valid JSON ({exc.msg})") from None
    return records


def write_parquet(rows: Sequence[Dict[str, Any]], path: Path) -> Path:
    """Validate and write rows atomically (temp file, then rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for i, row in enumerate(rows):
        check_row(row, f"row {i}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    pq.write_table(pa.Table.from_pylist(list(rows)), tmp)
    os.replace(tmp, path)
    return path


def read_rows(path: str) -> List[Dict[str, Any]]:
    """Read a parquet (or jsonl) file of schema rows; a broken row fails with its index."""
    if str(path).endswith((".jsonl", ".json")):
        import json

        rows = []
        with open(path) as f:
            for i, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path}: row {i}: not valid JSON ({exc.msg})") from None
    else:
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as exc:
            raise DataError(f"{path}: cannot read parquet ({exc})") from None
    for i, row in enumerate(rows):
        check_row(row, f"{path}: row {i}")
    return rows


RECIPES = Registry("dataset recipe", config_key="a task's recipe")
"""Recipe modules by name, imported when first asked for (each exposes ``build_rows(split, data_dir)``)."""
for _name in ("arith", "arith_chain", "arith_levels", "code_feedback", "countdown", "gsm8k", "humaneval", "math",
              "math_tool", "mbpp", "minif2f", "search", "search_example", "search_examples", "search_hops"):
    RECIPES.register_lazy(_name, f"{__package__}.{_name}")


def recipe(name: str):
    """The recipe module ``name``; a DataError naming the known ones otherwise."""
    try:
        return RECIPES[name]
    except UnknownName as exc:
        raise DataError(str(exc)) from None


def source_digest(name: str) -> Optional[str]:
    """SHA-256 of a generated recipe's module source (what its rows depend on), followed by the sources of the
    recipes its ``GENERATED_FROM`` names; None for other recipes."""
    module = recipe(name)
    if not getattr(module, "GENERATED", False):
        return None
    modules = [module, *(recipe(other) for other in getattr(module, "GENERATED_FROM", ()))]
    digest = hashlib.sha256()
    for m in modules:
        digest.update(Path(inspect.getsourcefile(m)).read_bytes())
    return digest.hexdigest()


def _digest_file(path: Path) -> Path:
    return path.with_name(path.name + ".source")


def prepare(name: str, split: str, data_dir: Optional[Path] = None, out_dir: Optional[Path] = None) -> Path:
    """Build ``name``'s split from ``data_dir`` (or the Hub when data_dir is None) into the cache; return the path.
    A generated recipe's split gets its source digest beside it."""
    rows = recipe(name).build_rows(split, data_dir)
    if not rows:
        raise DataError(f"recipe {name!r} produced no rows for split {split!r}")
    path = write_parquet(rows, (out_dir or cache_dir() / name) / f"{split}.parquet")
    digest = source_digest(name)
    if digest is not None:
        _digest_file(path).write_text(digest + "\n")
    return path


def find_split(name: str, split: str, explicit: Optional[Sequence[str]] = None) -> List[str]:
    """The parquet files for ``name``'s ``split``, found in the documented order."""
    if explicit:
        missing = [f for f in explicit if not Path(f).exists()]
        if missing:
            raise DataError(f"data files not found: {', '.join(missing)}")
        return list(explicit)
    cached = cache_dir() / name / f"{split}.parquet"
    digest = source_digest(name)
    if cached.exists() and (digest is None or (_digest_file(cached).exists()
                                               and _digest_file(cached).read_text().strip() == digest)):
        return [str(cached)]
    if digest is not None:  # generated: made from code alone, nothing to look up; built again if the code changed
        return [str(prepare(name, split))]
    errors = []
    data_dir = data_dir_from_env()
    if data_dir is not None:
        try:
            return [str(prepare(name, split, data_dir))]
        except FileNotFoundError as exc:
            errors.append(f"REASONRL_DATA_DIR={data_dir}: {exc}")
    if not hub_offline():
        try:
            return [str(prepare(name, split, None))]
        except Exception as exc:  # no network, no `datasets` package, ...
            errors.append(f"Hugging Face Hub: {type(exc).__name__}: {exc}")
    else:
        errors.append("Hugging Face Hub: offline (HF_HUB_OFFLINE=1)")
    raise DataError(
        f"no data for task {name!r} split {split!r}. Tried: " + "; ".join(errors) +
        f". Prepare it with: python -m reasonrl.datasets.prepare {name} --split {split} --data-dir DIR "
        f"(DIR holding the upstream files), or pass data.train_files=/data.val_files=.")
