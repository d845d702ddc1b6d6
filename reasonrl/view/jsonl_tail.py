"""Reading a JSON Lines file that another process appends to: only the complete lines added since the last read.

A line is complete once its newline is written (the trainer writes each row and its newline in one call and flushes);
bytes after the last newline are a line still being written, or one torn by a crash: they are left for the next read
and counted as ``truncated_tail`` meanwhile. A file that shrank (the trainer's resume cuts rows logged after its
checkpoint) or was replaced is read again from its start, and ``generation`` goes up so readers drop what they had.
Never writes.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple


class JsonlTail:
    """The complete lines of ``path`` as ``(offset, bytes)``, read incrementally by ``poll``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.offset = 0
        """Bytes of complete lines read so far."""
        self.generation = 0
        """Goes up each time the file shrank or was replaced and is read again from its start."""
        self.truncated_tail = 0
        """1 when bytes follow the last newline (an unfinished or torn last line), else 0."""
        self._inode: Optional[Tuple[int, int]] = None
        self.lock = threading.Lock()

    def _restart_needed(self, stat: os.stat_result) -> bool:
        inode = (stat.st_dev, stat.st_ino)
        replaced = self._inode is not None and inode != self._inode
        self._inode = inode
        return replaced or stat.st_size < self.offset

    def poll(self, on_reset: Callable[[], None], on_line: Callable[[int, bytes], None]) -> None:
        """Call ``on_line(offset, line)`` for each complete line added since the last poll (``on_reset()`` first
        when the file is read again from its start). A missing file has no lines."""
        with self.lock:
            try:
                stat = self.path.stat()
            except FileNotFoundError:
                if self.offset:
                    self.offset, self.generation, self._inode = 0, self.generation + 1, None
                    on_reset()
                self.truncated_tail = 0
                return
            if self._restart_needed(stat):
                self.offset, self.generation = 0, self.generation + 1
                on_reset()
            if stat.st_size == self.offset:
                self.truncated_tail = 0
                return
            for offset, line in self._lines_from(self.offset):
                on_line(offset, line)

    def _lines_from(self, start: int) -> Iterator[Tuple[int, bytes]]:
        with open(self.path, "rb") as f:
            f.seek(start)
            offset, rest = start, b""
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                lines: List[bytes] = (rest + chunk).split(b"\n")
                rest = lines.pop()
                for line in lines:
                    yield offset, line
                    offset += len(line) + 1
                    self.offset = offset
            self.truncated_tail = 1 if rest.strip() else 0


def step_row(line: bytes) -> Optional[dict]:
    """The JSON object on ``line`` when it is one with an integer ``"step"`` (the rows of metrics.jsonl and of the
    sample log), else None."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) and isinstance(row.get("step"), int) else None


def read_line(path: Path, offset: int) -> bytes:
    """The line of ``path`` that starts at ``offset`` (without its newline)."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.readline().rstrip(b"\n")
