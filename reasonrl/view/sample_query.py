"""Filtering and paging the sample log on its index (``sample_index``), so a page costs about the page, not the log.

Filters: ``step`` (exact) or ``step_min``/``step_max``, ``data_source``, ``verifier``, ``verdict`` (``correct``,
``wrong``, ``failed``), ``reason`` (case-insensitive substring), ``reward_min``/``reward_max``, ``len_min``/``len_max``
(response tokens; characters for rows logged without ``response_tokens``).

- The categorical filters (verdict, verifier, data source) pick the position arrays of their value combinations; the
  step range is a binary search (the trainer logs steps in order; a log that is not falls back to a scan); the count
  is the sum of the slices and a page is the ``offset``-th position of their union, found by binary search, and the
  ``limit`` after it: O(groups x log rows + page).
- ``reason``, reward and length ranges need the rows' values: their matches are scanned once per filter among the
  candidates above, kept (the last ``CACHED_SCANS`` such filters) and extended over new rows only, so paging through
  them is O(page).
"""
from __future__ import annotations

import heapq
import json
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .jsonl_tail import read_line
from .sample_index import GROUP_FIELDS, SampleIndex, key_hex
from .samples import number_param, verdict_of

MAX_PAGE = 200
CACHED_SCANS = 8
SCAN_KEYS = ("reason", "reward_min", "reward_max", "len_min", "len_max")


class Slices:
    """Sorted, disjoint position arrays, each cut to [lo, hi): their union in order without building it."""

    def __init__(self, parts: List[Tuple[Sequence[int], int, int]]) -> None:
        self.parts = [p for p in parts if p[2] > p[1]]

    def __len__(self) -> int:
        return sum(hi - lo for _, lo, hi in self.parts)

    def _rank_value(self, rank: int) -> int:
        """The position with ``rank`` positions of the union below it (binary search over positions)."""
        low, high = min(p[lo] for p, lo, _ in self.parts), max(p[hi - 1] for p, _, hi in self.parts)
        while low < high:
            mid = (low + high) // 2
            if sum(bisect_right(p, mid, lo, hi) - lo for p, lo, hi in self.parts) > rank:
                high = mid
            else:
                low = mid + 1
        return low

    def page(self, offset: int, limit: int) -> List[int]:
        if offset >= len(self) or limit <= 0:
            return []
        if len(self.parts) == 1:
            p, lo, hi = self.parts[0]
            return list(p[lo + offset:min(hi, lo + offset + limit)])
        first = self._rank_value(offset)
        heads = []
        for p, lo, hi in self.parts:
            start = bisect_left(p, first, lo, hi)
            heads.append(p[start:min(hi, start + limit)])
        return list(heapq.merge(*heads))[:limit]

    def since(self, start: int) -> List[int]:
        """Every position >= ``start``, in order."""
        return list(heapq.merge(*(p[bisect_left(p, start, lo, hi):hi] for p, lo, hi in self.parts)))


class SampleQuery:
    """Answers ``/api/samples`` on one index; keeps the matches of the last few scanned filters."""

    def __init__(self, index: SampleIndex) -> None:
        self.index = index
        self._scans: "OrderedDict[Tuple, Tuple[int, array, int, set, int]]" = OrderedDict()
        """Per scanned filter: (index resets, matching positions, rows scanned, matching reason codes, reason
        names checked)."""

    def _candidates(self, params: Mapping[str, str], steps: Tuple[Optional[float], Optional[float]]):
        """The rows passing the categorical filters and the step range (by binary search when steps are sorted): a
        ``Slices``, a ``range``, or None when a categorical value is unknown (nothing matches)."""
        ix = self.index
        wanted = {}
        for field in GROUP_FIELDS:
            if params.get(field):
                code = ix.codes[field].known().get(params[field])
                if code is None:
                    return None
                wanted[field] = code
        lo, hi, n = 0, len(ix), len(ix)
        if ix.steps_sorted:
            lo = 0 if steps[0] is None else bisect_left(ix.steps, steps[0])
            hi = n if steps[1] is None else bisect_right(ix.steps, steps[1])
        if not wanted:
            return range(lo, max(lo, hi))
        return Slices([(rows, bisect_left(rows, lo), bisect_left(rows, hi)) for rows in ix.group_lists(wanted)])

    def _scan(self, params: Mapping[str, str], candidates, steps, key: Tuple) -> array:
        """The candidates that also pass the step, reason, reward and length filters: kept per filter, extended
        over the rows indexed since."""
        ix = self.index
        cached = self._scans.pop(key, None)
        if cached is None or cached[0] != ix.resets:
            cached = (ix.resets, array("q"), 0, set(), 0)
        resets, matches, scanned, reasons, names_seen = cached
        needle = (params.get("reason") or "").lower()
        names = ix.codes["reason"].names
        if needle:
            reasons |= {c for c in range(names_seen, len(names)) if needle in names[c].lower()}
        new = candidates.since(scanned) if isinstance(candidates, Slices) else range(max(scanned, candidates.start),
                                                                                    candidates.stop)
        bounds = [(ix.steps, steps[0], steps[1])]
        for column, key_lo, key_hi in ((ix.rewards, "reward_min", "reward_max"), (ix.lengths, "len_min", "len_max")):
            bounds.append((column, number_param(params, key_lo), number_param(params, key_hi)))
        picked: Sequence[int] = new
        for column, lo, hi in bounds:
            if lo is not None:
                picked = [i for i in picked if column[i] >= lo]
            if hi is not None:
                picked = [i for i in picked if column[i] <= hi]
        if needle:
            reason_column = ix.columns["reason"]
            picked = [i for i in picked if reason_column[i] in reasons]
        matches.extend(picked)
        self._scans[key] = (resets, matches, len(ix), reasons, len(names))
        while len(self._scans) > CACHED_SCANS:
            self._scans.popitem(last=False)
        return matches

    def _matches(self, params: Mapping[str, str], offset: int, limit: int) -> Tuple[int, List[int]]:
        """(rows matching, the positions of the page). Caller holds the index's lock."""
        exact = number_param(params, "step")
        steps = (exact if exact is not None else number_param(params, "step_min"),
                 exact if exact is not None else number_param(params, "step_max"))
        for key in SCAN_KEYS[1:]:
            number_param(params, key)  # a bad number is named even when no row is a candidate
        candidates = self._candidates(params, steps)
        if candidates is None:
            return 0, []
        needs_scan = any(params.get(k) for k in SCAN_KEYS) or (not self.index.steps_sorted and steps != (None, None))
        if not needs_scan:
            if isinstance(candidates, Slices):
                return len(candidates), candidates.page(offset, limit)
            return len(candidates), list(candidates[offset:offset + limit])
        key = tuple(sorted((k, v) for k, v in params.items() if k not in ("offset", "limit", "run") and v))
        matches = self._scan(params, candidates, steps, key)
        return len(matches), list(matches[offset:offset + limit])

    def read_rows(self, positions: Sequence[int]) -> List[Dict[str, Any]]:
        """The log's rows at ``positions`` (index positions), each with its ``verdict`` and ``prompt_key``."""
        ix = self.index
        with ix.lock:
            located = [(ix.offsets[i], key_hex(ix.prompt_keys[i]), i) for i in positions]
        rows = []
        for offset, key, position in located:
            try:
                row = json.loads(read_line(ix.path, offset))
            except (OSError, ValueError):  # the file was cut since it was indexed: the next refresh re-reads it
                continue
            if isinstance(row, dict):
                rows.append({"verdict": verdict_of(row), **row, "prompt_key": key, "position": position})
        return rows

    def _summary(self) -> Dict[str, Any]:
        ix = self.index
        return {"facets": ix.facets(), "rows_in_log": len(ix), "skipped_lines": ix.skipped,
                "truncated_tail": ix.tail.truncated_tail, "indexing": ix.progress()}

    def query(self, params: Mapping[str, str]) -> Dict[str, Any]:
        """The rows matching the filters in ``params``, in file order, ``offset``/``limit`` paged (limit at most
        ``MAX_PAGE``), over the rows indexed so far (``indexing`` says how far). Raises ValueError naming a filter
        that is not a number."""
        self.index.refresh()
        start = max(0, int(number_param(params, "offset") or 0))
        limit = min(MAX_PAGE, max(1, int(number_param(params, "limit") or 20)))
        with self.index.lock:
            total, page = self._matches(params, start, limit)
            summary = self._summary()
        return {"total": total, "offset": start, "limit": limit, "rows": self.read_rows(page), **summary}

    def head(self, limit: int) -> Dict[str, Any]:
        """The first ``limit`` rows with the facets and counts, once the whole log is indexed (the export's copy)."""
        self.index.refresh(wait=True)
        with self.index.lock:
            summary = self._summary()
            positions = list(range(min(limit, len(self.index))))
        return {"rows": self.read_rows(positions), **summary}
