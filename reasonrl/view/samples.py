"""The sample log (``samples.jsonl``) behind the samples browser: an index of line offsets and the few fields the
filters read, built once and extended as the file grows; a page of rows is read back from the file by offset, so
the log's text is never held in memory.

A line that is not a JSON object with an integer ``step`` and a string ``response`` (another version's or a damaged
row) is skipped and counted. Filters: ``step`` (exact) or ``step_min``/``step_max``, ``data_source``, ``verifier``,
``verdict`` (``correct``, ``wrong``, ``failed``), ``reason`` (substring), ``reward_min``/``reward_max``,
``len_min``/``len_max`` (response tokens; characters for rows logged without ``response_tokens``).
"""
from __future__ import annotations

import json
import threading
from array import array
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from reasonrl.logging.sample_log import SAMPLE_LOG

from .jsonl_tail import JsonlTail, read_line, step_row

VERDICTS = ("correct", "wrong", "failed")
MAX_PAGE = 200


def verdict_of(row: Mapping[str, Any]) -> str:
    """``failed`` (no verdict), ``correct`` or ``wrong``; a row without ``correct`` is correct when its reward > 0."""
    if row.get("failed"):
        return "failed"
    correct = row.get("correct")
    if correct is None:
        reward = row.get("reward")
        correct = isinstance(reward, (int, float)) and reward > 0
    return "correct" if correct else "wrong"


def length_of(row: Mapping[str, Any]) -> int:
    tokens = row.get("response_tokens")
    return int(tokens) if isinstance(tokens, int) else len(row.get("response") or "")


def number_param(params: Mapping[str, str], key: str) -> Optional[float]:
    """``params[key]`` as a number (None when absent or empty); ValueError naming the parameter otherwise."""
    value = params.get(key)
    if value in (None, ""):
        return None
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"parameter {key}={value!r} is not a number") from None


class Codes:
    """Strings as small integers (the index keeps one per row)."""

    def __init__(self) -> None:
        self.names: List[str] = []
        self._code: Dict[str, int] = {}

    def known(self) -> Dict[str, int]:
        return self._code

    def code(self, name: Any) -> int:
        name = "" if name is None else str(name)
        if name not in self._code:
            self._code[name] = len(self.names)
            self.names.append(name)
        return self._code[name]


class SampleIndex:
    """Offsets and filter fields of every row of ``<run_dir>/samples.jsonl``; ``query`` filters and pages."""

    FIELDS = ("data_source", "verifier", "verdict", "reason")

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / SAMPLE_LOG
        self.tail = JsonlTail(self.path)
        self.lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.offsets, self.steps, self.lengths = array("q"), array("q"), array("q")
        self.rewards = array("d")
        self.codes = {f: Codes() for f in self.FIELDS}
        self.columns = {f: array("i") for f in self.FIELDS}
        self.counts: Dict[str, Counter] = {f: Counter() for f in self.FIELDS}
        self.skipped = 0
        self.lowest_step, self.highest_step = float("inf"), float("-inf")

    def _add(self, offset: int, line: bytes) -> None:
        if not line.strip():
            return
        row = step_row(line)
        if row is None or not isinstance(row.get("response"), str):
            self.skipped += 1
            return
        reward = row.get("reward")
        self.offsets.append(offset)
        self.steps.append(row["step"])
        self.lowest_step = min(self.lowest_step, row["step"])
        self.highest_step = max(self.highest_step, row["step"])
        self.lengths.append(length_of(row))
        self.rewards.append(float(reward) if isinstance(reward, (int, float)) else float("nan"))
        values = {"data_source": row.get("data_source"), "verifier": row.get("verifier"), "verdict": verdict_of(row),
                  "reason": row.get("reason")}
        for field, value in values.items():
            self.columns[field].append(self.codes[field].code(value))
            self.counts[field]["" if value is None else str(value)] += 1

    def refresh(self) -> None:
        with self.lock:
            self.tail.poll(self._reset, self._add)

    def __len__(self) -> int:
        return len(self.offsets)

    def facets(self) -> Dict[str, Any]:
        """The values each filter can take, with their counts, and the step range."""
        out: Dict[str, Any] = {f: dict(sorted(self.counts[f].items())) for f in ("data_source", "verifier", "verdict")}
        out["steps"] = [self.lowest_step, self.highest_step] if self.steps else []
        return out

    def failure_reasons(self) -> Dict[str, Counter]:
        """Per verifier, the reasons of the failed rows and their counts."""
        failed = self.codes["verdict"].code("failed")
        out: Dict[str, Counter] = {}
        for i, verdict in enumerate(self.columns["verdict"]):
            if verdict == failed:
                verifier = self.codes["verifier"].names[self.columns["verifier"][i]]
                out.setdefault(verifier, Counter())[self.codes["reason"].names[self.columns["reason"][i]]] += 1
        return out

    def _matches(self, params: Mapping[str, str]) -> Sequence[int]:
        """Positions of the rows that pass every filter given, in file order: one pass over the remaining candidates
        per filter, so an unfiltered page costs nothing and the most common filters one pass."""
        def number(key: str) -> Optional[float]:
            return number_param(params, key)

        exact_step = number("step")
        lo_step = exact_step if exact_step is not None else number("step_min")
        hi_step = exact_step if exact_step is not None else number("step_max")
        picked: Sequence[int] = range(len(self.offsets))
        for field in ("verdict", "verifier", "data_source"):
            if params.get(field):
                if params[field] not in self.codes[field].known():
                    return []
                code, column = self.codes[field].code(params[field]), self.columns[field]
                picked = [i for i in picked if column[i] == code]
        for column, lo, hi in ((self.steps, lo_step, hi_step), (self.rewards, number("reward_min"),
                                                                 number("reward_max")),
                               (self.lengths, number("len_min"), number("len_max"))):
            if lo is not None:
                picked = [i for i in picked if column[i] >= lo]
            if hi is not None:
                picked = [i for i in picked if column[i] <= hi]
        reason = (params.get("reason") or "").lower()
        if reason:
            codes = {c for c, name in enumerate(self.codes["reason"].names) if reason in name.lower()}
            column = self.columns["reason"]
            picked = [i for i in picked if column[i] in codes]
        return picked

    def _read(self, offsets) -> List[Dict[str, Any]]:
        rows = []
        for offset in offsets:
            try:
                row = json.loads(read_line(self.path, offset))
            except (OSError, ValueError):  # the file was cut since it was indexed: the next refresh re-reads it
                continue
            if isinstance(row, dict):
                rows.append({"verdict": verdict_of(row), **row})
        return rows

    def head(self, limit: int) -> Dict[str, Any]:
        """The first ``limit`` rows with the facets and counts (the export's copy of the log)."""
        self.refresh()
        with self.lock:
            offsets = list(self.offsets[:limit])
            out = {"facets": self.facets(), "rows_in_log": len(self.offsets), "skipped_lines": self.skipped,
                   "truncated_tail": self.tail.truncated_tail}
        return {"rows": self._read(offsets), **out}

    def query(self, params: Mapping[str, str]) -> Dict[str, Any]:
        """The rows matching the filters in ``params``, in file order, ``offset``/``limit`` paged (limit at most
        ``MAX_PAGE``). Raises ValueError naming a filter that is not a number."""
        self.refresh()
        with self.lock:
            picked = self._matches(params)
            start = max(0, int(number_param(params, "offset") or 0))
            limit = min(MAX_PAGE, max(1, int(number_param(params, "limit") or 20)))
            page = picked[start:start + limit]
            offsets = [self.offsets[i] for i in page]
            facets = self.facets()
            total_rows, skipped = len(self.offsets), self.skipped
        rows = self._read(offsets)
        return {"total": len(picked), "offset": start, "limit": limit, "rows": rows, "facets": facets,
                "rows_in_log": total_rows, "skipped_lines": skipped, "truncated_tail": self.tail.truncated_tail}
