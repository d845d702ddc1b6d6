"""The evaluation output directory: a crash-safe sample checkpoint, the final parquet table and summary.json.

Layout of ``eval.output_dir``::

    settings.json    what the samples depend on (model, data files, n, temperature, ...); a re-run must match it
    samples.jsonl    one verified problem per line, appended (and fsync'ed) after every batch: the checkpoint
    samples.parquet  the final per-problem table (written when every problem is done)
    summary.json     the final metrics (written when every problem is done)

A line cut short by a crash is ignored (and removed) when the checkpoint is read back.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List

SAMPLE_COLUMNS = ("responses", "finish_reasons", "num_tokens", "extracted", "correct", "scores", "reasons",
                  "timed_out", "failed")
"""Per-sample list columns of a problem record (parallel lists, one entry per sample)."""


class EvalStoreError(RuntimeError):
    """The output directory holds samples that do not belong to this evaluation."""


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


class SampleStore:
    """Reads and appends the per-problem records of one evaluation run."""

    def __init__(self, output_dir: str) -> None:
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.settings_path = self.dir / "settings.json"
        self.samples_path = self.dir / "samples.jsonl"
        self.parquet_path = self.dir / "samples.parquet"
        self.summary_path = self.dir / "summary.json"

    def check_settings(self, settings: Dict[str, Any]) -> None:
        """Record ``settings``, or raise EvalStoreError when stored samples were made with different ones."""
        settings = json.loads(json.dumps(settings))  # the JSON form, as it is compared after a reload
        if self.settings_path.exists() and self.samples_path.exists():
            stored = json.loads(self.settings_path.read_text())
            changed = sorted(k for k in set(stored) | set(settings) if stored.get(k) != settings.get(k))
            if changed:
                details = "; ".join(f"{k}: stored {stored.get(k)!r}, now {settings.get(k)!r}" for k in changed)
                raise EvalStoreError(
                    f"{self.dir} holds samples made with other settings ({details}). Use another eval.output_dir, "
                    f"or delete {self.samples_path} to start over.")
            return
        _atomic_write(self.settings_path, lambda p: p.write_text(json.dumps(settings, indent=2) + "\n"))

    def load(self) -> Dict[int, Dict[str, Any]]:
        """Stored records by problem index (a later line for the same problem wins); drops a torn last line."""
        if not self.samples_path.exists():
            return {}
        records: Dict[int, Dict[str, Any]] = {}
        good_bytes = 0
        with open(self.samples_path, "rb") as f:
            data = f.read()
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break  # a write cut short by a crash
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                break
            records[int(record["problem"])] = record
            good_bytes += len(line)
        if good_bytes < len(data):
            with open(self.samples_path, "r+b") as f:
                f.truncate(good_bytes)
        return records

    def append(self, records: Iterable[Dict[str, Any]]) -> None:
        """Append records durably: one write, flushed and fsync'ed before returning."""
        payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        if not payload:
            return
        with open(self.samples_path, "a", encoding="utf-8") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())

    def write_parquet(self, rows: List[Dict[str, Any]]) -> Path:
        """Write the final per-problem table atomically."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist(rows)
        # A column that is all None (no subject, no extracted answer) would get arrow's null type: make it string.
        fields = []
        for f in table.schema:
            if pa.types.is_null(f.type):
                f = f.with_type(pa.string())
            elif pa.types.is_list(f.type) and pa.types.is_null(f.type.value_type):
                f = f.with_type(pa.list_(pa.string()))
            fields.append(f)
        table = table.cast(pa.schema(fields))
        _atomic_write(self.parquet_path, lambda p: pq.write_table(table, p))
        return self.parquet_path

    def write_summary(self, summary: Dict[str, Any]) -> Path:
        """Write summary.json atomically."""
        _atomic_write(self.summary_path, lambda p: p.write_text(json.dumps(summary, indent=2) + "\n"))
        return self.summary_path
