"""Per-prompt statistics from the verifiers: attempts, passes and the last step, keyed by dataset position.

``PromptStats`` is what the curriculum samplers (``reasonrl/data/curriculum.py``) read and what the trainer updates
from each step's verified results. It can start from an offline evaluation's ``samples.parquet``
(``from_eval_samples``), and ``pass_rate_band`` keeps the prompts whose measured pass rate lies in a band.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from reasonrl.datasets import DataError

log = logging.getLogger(__name__)

STATE_VERSION = 1
"""Version of ``PromptStats.state_dict()``'s layout."""

NEVER = -1
"""``last_step`` of a prompt never recorded."""

SEEDED = 0
"""``last_step`` of a prompt whose statistics came from an evaluation (training steps count from 1)."""


def group_verdicts(rnd: Any) -> List[List[Optional[bool]]]:
    """A round's verifier results by group (``Round.groups``: one per prompt) -> per prompt, one entry per response:
    its ``correct`` flag, or None when it got no verdict (``VerifyResult.failed``)."""
    return [[None if getattr(s.result, "failed", False) else bool(s.result.correct) for s in group]
            for group in rnd.groups()]


class PromptStats:
    """Attempts, passes and the last step seen of each of ``size`` prompts (positions in the training dataset).

    An attempt is a response with a verdict; a pass is a correct one. ``prior`` = (a, b) is the Beta prior of the
    pass-rate estimate: ``posterior_mean`` is (a + passes) / (a + b + attempts), a / (a + b) for an unseen prompt.
    """

    def __init__(self, size: int, prior: Sequence[float] = (1.0, 1.0)) -> None:
        if size < 1:
            raise ValueError(f"PromptStats needs at least one prompt, got size={size}")
        if len(prior) != 2 or not all(np.isfinite(x) and x > 0 for x in prior):
            raise ValueError(f"data.pass_rate_prior must be two positive numbers [a, b], got {list(prior)}")
        self.size = int(size)
        self.prior = (float(prior[0]), float(prior[1]))
        self.attempts = np.zeros(self.size, dtype=np.int64)
        self.passes = np.zeros(self.size, dtype=np.int64)
        self.last_step = np.full(self.size, NEVER, dtype=np.int64)
        self.seeded_from: Optional[Dict[str, Any]] = None
        """Set by ``from_eval_samples``: the file, its problem count, how many matched, how many conflicted."""

    def update(self, indices: Sequence[int], correct: Sequence[Sequence[Optional[bool]]], step: int) -> None:
        """Record one round: ``correct[j]`` holds the verdicts of the responses to prompt ``indices[j]`` (True,
        False, or None for a response without a verdict, which is no attempt); every prompt in ``indices`` gets
        ``last_step = step``."""
        if len(indices) != len(correct):
            raise ValueError(f"PromptStats.update: {len(indices)} indices but {len(correct)} groups of verdicts")
        if int(step) < 0:
            raise ValueError(f"PromptStats.update: step must be >= 0, got {step}")
        for i, verdicts in zip(indices, correct):
            i = self._check_index(i)
            for v in verdicts:
                if v is not None and not isinstance(v, (bool, np.bool_)):
                    raise ValueError(f"PromptStats.update: prompt {i} has verdict {v!r}; expected True, False or "
                                     f"None (no verdict)")
            self.attempts[i] += sum(v is not None for v in verdicts)
            self.passes[i] += sum(bool(v) for v in verdicts if v is not None)
            self.last_step[i] = int(step)

    def _check_index(self, i: Any) -> int:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)) or not 0 <= i < self.size:
            raise ValueError(f"prompt index {i!r} is not a position in the {self.size} training prompts")
        return int(i)

    def posterior_mean(self) -> np.ndarray:
        """Estimated pass rate of every prompt: (a + passes) / (a + b + attempts)."""
        a, b = self.prior
        return (a + self.passes) / (a + b + self.attempts)

    def pass_rate(self) -> np.ndarray:
        """Measured pass rate passes / attempts of every prompt; NaN where there is no attempt."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.attempts > 0, self.passes / np.maximum(self.attempts, 1), np.nan)

    def subset(self, positions: Sequence[int]) -> "PromptStats":
        """The statistics of ``positions`` only, renumbered 0..len-1 in that order (after filtering the dataset)."""
        idx = np.asarray([self._check_index(i) for i in positions], dtype=np.int64)
        out = PromptStats(len(idx), self.prior)
        out.attempts, out.passes, out.last_step = self.attempts[idx], self.passes[idx], self.last_step[idx]
        return out

    def state_dict(self) -> Dict[str, Any]:
        """JSON-friendly and compact: the size, then parallel lists for the recorded prompts only."""
        rows = np.flatnonzero((self.attempts > 0) | (self.last_step != NEVER))
        return {"version": STATE_VERSION, "size": self.size, "index": rows.tolist(),
                "attempts": self.attempts[rows].tolist(), "passes": self.passes[rows].tolist(),
                "last_step": self.last_step[rows].tolist()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Replace the statistics with ``state``; ValueError when it is for a dataset of another size."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"prompt statistics: unknown layout (version {state.get('version')!r} "
                             f"if a dict), expected version {STATE_VERSION}")
        if int(state["size"]) != self.size:
            raise ValueError(f"prompt statistics are for {state['size']} training prompts, but the dataset has "
                             f"{self.size} now (were data.train_files, data.max_prompt_length or "
                             f"data.pass_rate_band changed?)")
        lists = [state[k] for k in ("index", "attempts", "passes", "last_step")]
        if len({len(x) for x in lists}) != 1:
            raise ValueError("prompt statistics: index, attempts, passes and last_step differ in length")
        rows = np.asarray(lists[0], dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.size):
            raise ValueError(f"prompt statistics: an index is outside 0..{self.size - 1}")
        self.attempts = np.zeros(self.size, dtype=np.int64)
        self.passes = np.zeros(self.size, dtype=np.int64)
        self.last_step = np.full(self.size, NEVER, dtype=np.int64)
        self.attempts[rows] = lists[1]
        self.passes[rows] = lists[2]
        self.last_step[rows] = lists[3]

    @classmethod
    def from_eval_samples(cls, path: str, dataset_rows: Sequence[Dict[str, Any]],
                          prior: Sequence[float] = (1.0, 1.0)) -> "PromptStats":
        """Statistics seeded from ``python -m reasonrl.eval``'s per-problem results (``samples.parquet``, its
        ``samples.jsonl`` checkpoint, or the output directory holding them) for the prompts ``dataset_rows``.

        A stored problem matches the dataset rows with its ``data_source`` and ``extra_info.index`` whose last user
        message is the problem's ``question`` (same index, other text: a conflict, no match); when no row has that
        key (or the problem has no index) it matches the rows with that text. Its samples with a verdict become
        attempts (``failed`` ones are left out), its correct ones passes, with ``last_step = 0``; ``seeded_from``
        says how many problems matched. DataError naming the file when it is missing, unreadable or matches no
        row."""
        records, source = read_eval_records(path)
        stats = cls(len(dataset_rows), prior)
        by_key: Dict[Tuple[str, Any], List[int]] = {}
        by_text: Dict[str, List[int]] = {}
        texts = [last_user_message(row) for row in dataset_rows]
        for pos, row in enumerate(dataset_rows):
            index = (row.get("extra_info") or {}).get("index")
            if index is not None:
                by_key.setdefault((str(row.get("data_source")), _norm_index(index)), []).append(pos)
            by_text.setdefault(texts[pos], []).append(pos)
        matched = conflicts = 0
        for rec in records:
            question = str(rec.get("question") or "")
            candidates = [] if rec.get("index") is None else \
                by_key.get((str(rec.get("data_source")), _norm_index(rec["index"])), [])
            if candidates:
                hits = [p for p in candidates if texts[p] == question]
                conflicts += not hits
            else:
                hits = by_text.get(question, []) if question else []
            if not hits:
                continue
            matched += 1
            correct = list(rec.get("correct") or [])
            failed = list(rec.get("failed") or rec.get("timed_out") or [False] * len(correct))
            verdicts = [None if f else bool(c) for c, f in zip(correct, failed)]
            stats.update(hits, [verdicts] * len(hits), SEEDED)
        if not matched:
            hint = (f" ({conflicts} share a data_source and extra_info.index with a training row but not its "
                    f"question: evaluated on another split? use eval.split=train)" if conflicts else "")
            raise DataError(f"{source}: none of its {len(records)} problems matches one of the {len(dataset_rows)} "
                            f"training prompts by data_source + extra_info.index and question text{hint}")
        log.info("seeded prompt statistics of %d training prompts from %d of the %d problems in %s",
                 int((stats.last_step == SEEDED).sum()), matched, len(records), source)
        stats.seeded_from = {"file": str(source), "problems": len(records), "matched": matched,
                             "conflicts": conflicts}
        return stats


def _norm_index(index: Any) -> str:
    """extra_info.index as a comparable key (parquet may give 3, 3.0 or "3")."""
    if isinstance(index, float) and index.is_integer():
        index = int(index)
    return str(index)


def last_user_message(row: Dict[str, Any]) -> str:
    """The text the evaluation stores as a problem's ``question``: the row's last user message."""
    users = [m.get("content", "") for m in row.get("prompt") or [] if m.get("role") == "user"]
    return str(users[-1]) if users else ""


def read_eval_records(path: str) -> Tuple[List[Dict[str, Any]], Path]:
    """The per-problem records of an evaluation: a ``samples.parquet``, a ``samples.jsonl`` or a directory with
    either (parquet preferred). DataError naming the path when there is nothing readable."""
    p = Path(path)
    if p.is_dir():
        found = [p / name for name in ("samples.parquet", "samples.jsonl") if (p / name).exists()]
        if not found:
            raise DataError(f"data.pass_rate_file={path}: the directory holds no samples.parquet or samples.jsonl "
                            f"(the output of python -m reasonrl.eval)")
        p = found[0]
    if not p.exists():
        raise DataError(f"data.pass_rate_file={path}: no such file")
    columns = ("index", "data_source", "question", "correct", "failed", "timed_out")
    try:
        if p.suffix == ".jsonl":
            records = [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(p)
            records = table.select([c for c in columns if c in table.column_names]).to_pylist()
    except Exception as exc:  # a torn or foreign file: name it
        raise DataError(f"data.pass_rate_file={p}: cannot be read as evaluation samples ({exc})") from None
    if not records or "correct" not in records[0]:
        raise DataError(f"data.pass_rate_file={p}: no problem records with a 'correct' list (expected the "
                        f"samples.parquet of python -m reasonrl.eval)")
    return records, p


def pass_rate_band(stats: PromptStats, band: Sequence[float], keep_unmeasured: bool = True) -> List[int]:
    """Positions of the prompts whose measured pass rate (passes / attempts) lies in the closed band [lo, hi];
    prompts without an attempt are kept when ``keep_unmeasured``. DataError when the band keeps nothing."""
    lo, hi = (float(x) for x in band)
    if not 0.0 <= lo <= hi <= 1.0:
        raise ValueError(f"data.pass_rate_band must be [lo, hi] with 0 <= lo <= hi <= 1, got {list(band)}")
    rate = stats.pass_rate()
    measured = stats.attempts > 0
    keep = (measured & (rate >= lo) & (rate <= hi)) | (~measured & keep_unmeasured)
    kept = np.flatnonzero(keep).tolist()
    if not kept:
        raise DataError(f"data.pass_rate_band=[{lo}, {hi}] keeps none of the {stats.size} training prompts "
                        f"({int(measured.sum())} measured)")
    return kept

