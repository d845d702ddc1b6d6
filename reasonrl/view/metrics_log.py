"""A run's ``metrics.jsonl`` as records in file order, read incrementally (``JsonlTail``).

Each record is the trainer's row (``"step"`` and the metrics) plus ``"_samples"``: the responses trained on up to and
including that step (the sum of each step's ``levels/responses``, or of its per-verifier counts and failures when a
run predates that metric), the curves' other x axis. A line that is not a JSON object with an integer step is skipped
and counted, as is an unfinished last line (``truncated_tail``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

from .jsonl_tail import JsonlTail, step_row

METRICS_FILE = "metrics.jsonl"


def responses_in_step(record: Dict[str, Any]) -> float:
    """The responses a step trained on: ``levels/responses``, else its ``reward/<verifier>/count`` plus failures."""
    value = record.get("levels/responses")
    if isinstance(value, (int, float)):
        return float(value)
    counted = sum(v for k, v in record.items()
                  if k.startswith("reward/") and k.endswith("/count") and isinstance(v, (int, float)))
    failed = record.get("reward/failed_count")
    return float(counted + (failed if isinstance(failed, (int, float)) else 0))


class MetricsLog:
    """``records`` of ``<run_dir>/metrics.jsonl``; ``refresh()`` reads the lines appended since the last call."""

    def __init__(self, run_dir: Path) -> None:
        self.tail = JsonlTail(Path(run_dir) / METRICS_FILE)
        self.records: List[Dict[str, Any]] = []
        self.skipped = 0
        self._samples = 0.0

    def _reset(self) -> None:
        self.records, self.skipped, self._samples = [], 0, 0.0

    def _add(self, offset: int, line: bytes) -> None:
        if not line.strip():
            return
        record = step_row(line)
        if record is None:
            self.skipped += 1
            return
        self._samples += responses_in_step(record)
        record["_samples"] = self._samples
        self.records.append(record)

    def refresh(self) -> "MetricsLog":
        self.tail.poll(self._reset, self._add)
        return self

    def since(self, index: int, generation: int) -> Dict[str, Any]:
        """The records from position ``index`` on (all of them, with ``reset``, when ``generation`` is not the
        current one), and the cursor for the next call."""
        self.refresh()
        reset = generation != self.tail.generation
        start = 0 if reset else max(0, index)
        return {"records": self.records[start:], "next": len(self.records), "generation": self.tail.generation,
                "reset": reset, "skipped_lines": self.skipped, "truncated_tail": self.tail.truncated_tail}
