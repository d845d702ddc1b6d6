"""The index of the sample log (``samples.jsonl``) behind the samples browser: per row its byte offset and the fields
the filters read, in typed arrays (about 60 bytes a row; the log's text stays in the file and a page's rows are read
back by offset), plus the rows of each (verdict, verifier, data source) as sorted position arrays, which answer the
categorical filters without a scan (``sample_query``).

Built by ``refresh``: up to ``sync_bytes`` of unread log in the caller's thread, more (a large log on the first
request, or a burst) in a background thread that parses outside the lock and adds its rows in batches, so every
request answers at once and pages over the rows indexed so far; ``progress()`` says how far it is. A line that is not
a JSON object with an integer ``step`` and a string ``response`` (another version's or a damaged row) is skipped and
counted. Never writes.
"""
from __future__ import annotations

import hashlib
import threading
from array import array
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from reasonrl.logging.sample_log import SAMPLE_LOG

from .jsonl_tail import JsonlTail, step_row
from .samples import Codes, length_of, verdict_of

SYNC_BYTES = 1 << 20
"""Unread log up to this many bytes is indexed in the requesting thread (a live run's new rows); more in the
background."""
BATCH_LINES = 4096
"""Lines parsed between two additions to the index (the lock is held only while a batch is added)."""
GROUP_FIELDS = ("verdict", "verifier", "data_source")
"""The categorical filters answered from position arrays, one per combination of their values."""
CODED_FIELDS = ("data_source", "verifier", "verdict", "reason")


def prompt_key(prompt: Any) -> int:
    """A stable 64-bit key of a prompt's text (the sample log records the prompt as text only): the same prompt in
    two steps has the same key, in every process."""
    digest = hashlib.blake2b(str(prompt).encode("utf-8", "replace"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def key_hex(key: int) -> str:
    return f"{key & 0xFFFFFFFFFFFFFFFF:016x}"


def key_from_hex(text: str) -> int:
    """``key_hex``'s inverse; ValueError for anything but 16 hex digits."""
    if len(text) != 16:
        raise ValueError(f"prompt key {text!r} is not 16 hex digits")
    value = int(text, 16)
    return value - (1 << 64) if value >= 1 << 63 else value


Parsed = Tuple[int, int, int, float, Any, Any, str, Any, int]
"""offset, step, length, reward, data_source, verifier, verdict, reason, prompt key."""


def parse_line(offset: int, line: bytes) -> Optional[Parsed]:
    """The indexed fields of one log line, or None for a line that is not a sample-log row."""
    row = step_row(line)
    if row is None or not isinstance(row.get("response"), str):
        return None
    reward = row.get("reward")
    reward = float(reward) if isinstance(reward, (int, float)) else float("nan")
    return (offset, row["step"], length_of(row), reward, row.get("data_source"), row.get("verifier"), verdict_of(row),
            row.get("reason"), prompt_key(row.get("prompt")))


class SampleIndex:
    """Offsets and filter fields of every row of ``<run_dir>/samples.jsonl``."""

    def __init__(self, run_dir: Path, sync_bytes: int = SYNC_BYTES) -> None:
        self.path = Path(run_dir) / SAMPLE_LOG
        self.tail = JsonlTail(self.path)
        self.sync_bytes = sync_bytes
        self.lock = threading.Lock()
        """Guards the columns; held by readers and while a batch is added."""
        self.idle = threading.Event()
        """Set while no background indexer runs (wait on it for a complete index)."""
        self.idle.set()
        self.after_batch: Optional[Callable[[int, int], None]] = None
        """Called in the indexer's thread after each batch with (lines read, lines in the file): a hook for progress
        and for tests that need the index half built."""
        self.resets = 0
        """Goes up each time the index is dropped (the file shrank or was replaced); query caches key on it."""
        self._start_lock, self._build_lock = threading.Lock(), threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self.lines_done = self.lines_total = 0
        self._reset()

    def _reset(self) -> None:
        with self.lock:
            self.offsets, self.steps, self.lengths = array("q"), array("q"), array("q")
            self.rewards = array("d")
            self.prompt_keys = array("q")
            self.codes = {f: Codes() for f in CODED_FIELDS}
            self.columns = {f: array("i") for f in CODED_FIELDS}
            self.counts: Dict[str, Counter] = {f: Counter() for f in CODED_FIELDS}
            self.groups: Dict[Tuple[int, ...], array] = {}
            self.skipped = 0
            self.steps_sorted = True
            self.lowest_step, self.highest_step = float("inf"), float("-inf")
            self.resets += 1
            self.lines_done = self.lines_total = 0

    # ------------------------------------------------------------------ building
    def _add_batch(self, batch: Sequence[Optional[Parsed]], lines: int) -> None:
        with self.lock:
            self.lines_done += lines
            self.lines_total = max(self.lines_total, self.lines_done)
            for parsed in batch:
                if parsed is None:
                    self.skipped += 1
                    continue
                offset, step, length, reward, *coded, key = parsed
                position = len(self.offsets)
                if self.steps and step < self.steps[-1]:
                    self.steps_sorted = False
                self.offsets.append(offset)
                self.steps.append(step)
                self.lengths.append(length)
                self.rewards.append(reward)
                self.prompt_keys.append(key)
                self.lowest_step, self.highest_step = min(self.lowest_step, step), max(self.highest_step, step)
                for field, value in zip(CODED_FIELDS, coded):
                    self.columns[field].append(self.codes[field].code(value))
                    self.counts[field]["" if value is None else str(value)] += 1
                group = tuple(self.columns[f][position] for f in GROUP_FIELDS)
                self.groups.setdefault(group, array("q")).append(position)

    def _count_lines(self) -> None:
        """Set ``lines_total``: the lines read so far plus the newlines in the unread part of the file."""
        unread = 0
        try:
            with open(self.path, "rb") as f:
                f.seek(self.tail.offset)
                for chunk in iter(lambda: f.read(1 << 22), b""):
                    unread += chunk.count(b"\n")
        except OSError:
            return
        with self.lock:
            self.lines_total = self.lines_done + unread

    def _build(self) -> None:
        """Index the complete lines not read yet (from the start when the file shrank or was replaced)."""
        batch: List[Optional[Parsed]] = []
        lines = 0

        def flush() -> None:
            nonlocal lines
            self._add_batch(batch, lines)
            batch.clear()
            lines = 0
            if self.after_batch is not None:
                self.after_batch(self.lines_done, self.lines_total)

        def on_line(offset: int, line: bytes) -> None:
            nonlocal lines
            lines += 1
            if line.strip():
                batch.append(parse_line(offset, line))
            if lines >= BATCH_LINES:
                flush()

        def on_reset() -> None:
            batch.clear()
            self._reset()
            self._count_lines()

        with self._build_lock:  # one builder at a time
            self._count_lines()
            self.tail.poll(on_reset, on_line)
            if lines or batch:
                flush()

    def _build_in_background(self) -> None:
        try:
            self._build()
        finally:
            self.idle.set()

    def _unread_bytes(self) -> int:
        try:
            return self.path.stat().st_size - self.tail.offset
        except FileNotFoundError:
            return 0

    def refresh(self, wait: bool = False) -> None:
        """Index what was appended since the last call: here when it is little, else in the background (with
        ``wait``: here, and after any background indexer has finished)."""
        with self._start_lock:
            running = self._thread is not None and self._thread.is_alive()
            if not running and not wait and self._unread_bytes() > self.sync_bytes:
                self.idle.clear()
                self._thread = threading.Thread(target=self._build_in_background, name="view-sample-index",
                                                daemon=True)
                self._thread.start()
                return
        if running:
            if not wait:
                return
            self.idle.wait()
        self._build()

    def progress(self) -> Dict[str, Any]:
        """``building`` (a background indexer runs), ``lines_done`` of ``lines_total`` (the log's lines)."""
        return {"building": not self.idle.is_set(), "lines_done": self.lines_done,
                "lines_total": max(self.lines_total, self.lines_done)}

    # ------------------------------------------------------------------ reading (callers hold ``lock``)
    def __len__(self) -> int:
        return len(self.offsets)

    def facets(self) -> Dict[str, Any]:
        """The values each filter can take, with their counts, and the step range."""
        out: Dict[str, Any] = {f: dict(sorted(self.counts[f].items())) for f in GROUP_FIELDS}
        out["steps"] = [self.lowest_step, self.highest_step] if self.steps else []
        return out

    def group_lists(self, wanted: Dict[str, int]) -> List[array]:
        """The position arrays of the groups whose codes equal ``wanted`` (field -> code) on the fields given."""
        picks = [(GROUP_FIELDS.index(f), code) for f, code in wanted.items()]
        return [rows for group, rows in self.groups.items() if all(group[i] == code for i, code in picks)]

    def failure_reasons(self) -> Dict[str, Counter]:
        """Per verifier, the reasons of the failed rows and their counts (the failed rows' groups only)."""
        with self.lock:
            failed = self.codes["verdict"].known().get("failed")
            out: Dict[str, Counter] = {}
            if failed is None:
                return out
            verifiers, reasons = self.codes["verifier"].names, self.codes["reason"].names
            for rows in self.group_lists({"verdict": failed}):
                for i in rows:
                    verifier = verifiers[self.columns["verifier"][i]]
                    out.setdefault(verifier, Counter())[reasons[self.columns["reason"][i]]] += 1
            return out
