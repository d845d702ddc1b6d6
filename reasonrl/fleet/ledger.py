"""The prompt ledger of one epoch: every prompt index is in exactly one state, and no crash loses or duplicates one.

States: ``pending`` (to be issued), ``issued`` to a replica with an attempt number (1, 2, ... per prompt), ``done``
(its result accepted, with an optional small JSON payload) and ``failed`` with a reason. Transitions:

    pending --issue--> issued(r, a) --complete(a)--> done
                                    --fail(a)-----> failed(reason)
                                    --revoke------> pending   (its replica died, or a resume found it in flight)
    done --train--> trained   (the loop trained on its result)
    done --drop(reason)--> failed   (the loop could not train on its result: every sample failed verification)

In the fleet's words (docs/fleet.md): pending is queued, issued is generating, done is verified, failed is dropped.

Every transition is one JSON line appended to a journal file, flushed and fsync'd before the call returns, so what a
caller was told is on disk. ``Ledger.open`` replays the journal: a torn last line (the process died inside a write)
is cut off, anything else that does not replay (a bad line before the end, a transition from the wrong state, another
epoch's prompts) is a ``LedgerError`` naming the file and line, never a silent guess. Then every prompt still
``issued`` is revoked (its attempt may never answer: the process that waited for it is gone), so after a kill -9 at
any point the resumed run issues again exactly the prompts that were issued and not done, and never a done one.

Exactly once: a result counts only for the prompt's current attempt (``complete``/``fail`` with another attempt, or
for a prompt no longer issued, return False and change nothing), so when a replica dies and its prompts are revoked
and issued again, a late answer of the dead replica's attempt is dropped. A result must be consumed only when
``complete`` returned True: the done line (with its payload) is then already on disk.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

PENDING, ISSUED, DONE, FAILED, TRAINED = "pending", "issued", "done", "failed", "trained"
STATES = (PENDING, ISSUED, DONE, FAILED, TRAINED)
RESUME = "resume"
"""The revoke reason of the prompts a resume found in flight."""


class LedgerError(RuntimeError):
    """The journal cannot be replayed, or a call asks for a transition its prompt's state does not allow."""


@dataclass(frozen=True)
class PromptState:
    state: str
    replica: Optional[str] = None
    """The replica of the current (``issued``) or last attempt."""
    attempt: int = 0
    """Attempts issued so far (the current one while ``issued``)."""
    reason: Optional[str] = None
    """Why it failed (``failed``)."""
    payload: Any = None
    """What ``complete`` stored with the result (``done``)."""


class Ledger:
    """One epoch's prompts and their states, backed by an append-only journal (see the module docstring)."""

    def __init__(self, path: Path, epoch: int, prompts: List[int], meta: Optional[Dict[str, Any]] = None) -> None:
        self.path, self.epoch, self.prompts = Path(path), epoch, list(prompts)
        self.meta: Optional[Dict[str, Any]] = meta
        """What the caller recorded in the journal's header with the prompts (JSON; the fleet: each prompt's dataset
        position, ``data_indices``), read back from an existing journal's header."""
        self._states: Dict[int, PromptState] = {i: PromptState(PENDING) for i in self.prompts}
        self._file = None
        self.revoked_on_resume: List[int] = []
        """The prompts that ``open`` found issued (in flight when the last process stopped) and revoked."""

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, path, epoch: int, prompts: Iterable[int], meta: Optional[Dict[str, Any]] = None) -> "Ledger":
        """The ledger of ``epoch`` over ``prompts`` (dataset indices, in the epoch's order), replayed from ``path``
        when it exists (the journal of a previous process), else a new journal whose header holds ``meta`` too (a
        replayed journal keeps the ``meta`` of its header)."""
        prompts = list(prompts)
        if len(set(prompts)) != len(prompts):
            raise LedgerError(f"{path}: the epoch's prompt indices repeat: each prompt must appear once")
        ledger = cls(Path(path), epoch, prompts, meta)
        lines = ledger._read_journal()
        if not lines:
            header = {"op": "epoch", "epoch": epoch, "prompts": prompts}
            ledger._append(header if meta is None else {**header, "meta": meta})
        else:
            ledger._check_header(lines[0])
            ledger.meta = lines[0].get("meta")
            for number, record in enumerate(lines[1:], start=2):
                ledger._replay(record, number)
        for index in ledger.issued():
            ledger.revoke(index, RESUME)
            ledger.revoked_on_resume.append(index)
        return ledger

    def _read_journal(self) -> List[dict]:
        """The journal's complete records; a torn last line is cut off the file."""
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab")
            _fsync_dir(self.path.parent)
            return []
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        complete, tail = lines[:-1], lines[-1]  # the part after the last newline: empty, or a torn line
        records = []
        for number, raw in enumerate(complete, start=1):
            try:
                records.append(json.loads(raw))
            except ValueError:
                raise LedgerError(f"{self.path}: line {number} is not a JSON record ({raw[:80]!r}); the journal is "
                                  "damaged before its end, which no crash does") from None
        if tail:
            with open(self.path, "r+b") as f:  # cut the torn line: the next record starts on a clean line
                f.truncate(len(data) - len(tail))
                os.fsync(f.fileno())
        self._file = open(self.path, "ab")
        return records

    def _check_header(self, record: dict) -> None:
        if record.get("op") != "epoch":
            raise LedgerError(f"{self.path}: line 1 is not the epoch record: {record}")
        if record.get("epoch") != self.epoch or record.get("prompts") != self.prompts:
            raise LedgerError(f"{self.path}: the journal is of epoch {record.get('epoch')} over "
                              f"{len(record.get('prompts') or [])} prompts, not epoch {self.epoch} over "
                              f"{len(self.prompts)} prompts in this order: a different epoch or data order")

    def _replay(self, record: dict, number: int) -> None:
        op, index, attempt = record.get("op"), record.get("i"), record.get("attempt")
        try:
            if op == "issue":
                got = self._issue(index, record["replica"])
                if got != attempt:
                    raise LedgerError(f"attempt {attempt}, expected {got}")
            elif op in ("train", "drop"):
                self._check_trainable(index)
                self._apply(record)
            elif op in ("done", "fail", "revoke"):
                if not self._is_current(index, attempt):
                    raise LedgerError(f"prompt {index} attempt {attempt} is not the one in flight")
                self._apply(record)
            else:
                raise LedgerError(f"unknown op {op!r}")
        except (LedgerError, KeyError) as exc:
            raise LedgerError(f"{self.path}: line {number} ({record}) does not replay: {exc}") from None

    # ------------------------------------------------------------------ transitions

    def issue(self, index: int, replica: str) -> int:
        """``index`` goes to ``replica``; its attempt number (pass it back with the result)."""
        attempt = self._issue(index, replica)
        self._append({"op": "issue", "i": index, "replica": replica, "attempt": attempt})
        return attempt

    def complete(self, index: int, attempt: int, payload: Any = None) -> bool:
        """The result of ``attempt`` arrived: True and ``index`` is done (with ``payload``, JSON, on disk); False
        when that attempt is not the one in flight (a late answer of a revoked attempt, or a second answer)."""
        return self._finish({"op": "done", "i": index, "attempt": attempt, "payload": payload})

    def fail(self, index: int, attempt: int, reason: str) -> bool:
        """``attempt`` failed for good: True and ``index`` is failed with ``reason``; False as ``complete``."""
        return self._finish({"op": "fail", "i": index, "attempt": attempt, "reason": str(reason)})

    def revoke(self, index: int, reason: str) -> None:
        """``index``'s attempt in flight will not answer (its replica died): back to pending, to be issued again."""
        state = self.state(index)
        if state.state != ISSUED:
            raise LedgerError(f"prompt {index} is {state.state}, not issued: nothing to revoke")
        record = {"op": "revoke", "i": index, "attempt": state.attempt, "reason": str(reason)}
        self._append(record)
        self._apply(record)

    def trained(self, index: int) -> None:
        """``index``'s result (done) was trained on: the prompt is finished for the epoch."""
        self._check_trainable(index)
        record = {"op": "train", "i": index}
        self._append(record)
        self._apply(record)

    def drop(self, index: int, reason: str) -> None:
        """``index``'s result (done) could not be trained on (``reason``: e.g. every sample of its group failed
        verification, so the group is out of the loss): failed, the prompt is finished for the epoch."""
        self._check_trainable(index)
        record = {"op": "drop", "i": index, "reason": str(reason)}
        self._append(record)
        self._apply(record)

    def replica_lost(self, replica: str, reason: str) -> List[int]:
        """Revoke every prompt in flight on ``replica``; their indices, each to be issued again once."""
        lost = [i for i in self.issued() if self._states[i].replica == replica]
        for index in lost:
            self.revoke(index, f"replica {replica}: {reason}")
        return lost

    # ------------------------------------------------------------------ queries

    def state(self, index: int) -> PromptState:
        if index not in self._states:
            raise LedgerError(f"prompt {index} is not in epoch {self.epoch}'s ledger ({self.path})")
        return self._states[index]

    def in_state(self, state: str) -> List[int]:
        """The prompts in ``state``, in the epoch's order."""
        return [i for i in self.prompts if self._states[i].state == state]

    def pending(self) -> List[int]:
        return self.in_state(PENDING)

    def issued(self) -> List[int]:
        return self.in_state(ISSUED)

    def counts(self) -> Dict[str, int]:
        return {s: len(self.in_state(s)) for s in STATES}

    def finished(self) -> bool:
        """Every prompt done, trained or failed."""
        return all(s.state in (DONE, FAILED, TRAINED) for s in self._states.values())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    # ------------------------------------------------------------------ internals

    def _issue(self, index: int, replica: str) -> int:
        state = self.state(index)
        if state.state != PENDING:
            raise LedgerError(f"prompt {index} is {state.state}, not pending: it cannot be issued")
        attempt = state.attempt + 1
        self._states[index] = PromptState(ISSUED, str(replica), attempt)
        return attempt

    def _check_trainable(self, index: int) -> None:
        state = self.state(index)
        if state.state != DONE:
            raise LedgerError(f"prompt {index} is {state.state}, not done: it cannot be trained on")

    def _is_current(self, index: int, attempt: int) -> bool:
        state = self.state(index)
        return state.state == ISSUED and state.attempt == attempt

    def _finish(self, record: dict) -> bool:
        if not self._is_current(record["i"], record["attempt"]):
            return False
        self._append(record)  # on disk first: a crash before this line leaves the attempt in flight
        self._apply(record)
        return True

    def _apply(self, record: dict) -> None:
        old = self._states[record["i"]]
        if record["op"] == "done":
            new = PromptState(DONE, old.replica, old.attempt, payload=record.get("payload"))
        elif record["op"] == "train":
            new = PromptState(TRAINED, old.replica, old.attempt, payload=old.payload)
        elif record["op"] in ("fail", "drop"):
            new = PromptState(FAILED, old.replica, old.attempt, reason=record["reason"])
        else:
            new = PromptState(PENDING, old.replica, old.attempt)
        self._states[record["i"]] = new

    def _append(self, record: dict) -> None:
        self._write_line(json.dumps(record, separators=(",", ":")).encode() + b"\n")

    def _write_line(self, line: bytes) -> None:
        """Append one journal line and make it durable (one write, then fsync)."""
        self._file.write(line)
        self._file.flush()
        os.fsync(self._file.fileno())


def _fsync_dir(directory: Path) -> None:
    """Make a new file's directory entry durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
