"""Did a run train each prompt exactly once? Its ledger (the round journals of ``ledger.py`` in a run's ``fleet/``
folder) compared with the ledger of an uninterrupted run of the same command: pure reading, nothing is written.

A prompt is a dataset position when every journal's header records them (``meta.data_indices``, as the fleet writes
them), else a prompt id (``step * train_batch_size + k``). Per prompt, the times it was trained (``train`` records) in
the reference run and in the audited one, and the reasons it was dropped (``fail`` and ``drop`` records) in the
audited one:

- lost: trained fewer times than in the reference, the difference not accounted for by a drop;
- duplicated: trained more times than in the reference (a prompt the reference never trained counts here too);
- dropped: not trained because the ledger records why (``failed`` with its reason);
- misplaced: prompt ids (positions in the run's order) trained on another dataset position than the reference's:
  the same prompts, but drawn in another order (a data position not restored exactly).

``audit(reference_dir, run_dir)``: an ``Audit`` with those per prompt and their totals (``counts()``). The fault matrix
(``benchmarks/fleet_faults.py``, ``tests/e2e/test_fleet_faults.py``, docs/fleet.md) asserts 0 lost, 0 duplicated.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

JOURNALS = "round_*.jsonl"


@dataclass
class RunLedger:
    """What a folder of journals says, per prompt id: its dataset position (when recorded), the times it was trained,
    and the reasons it was dropped."""

    data_index: Dict[int, Optional[int]] = field(default_factory=dict)
    trained: Counter = field(default_factory=Counter)
    dropped: Dict[int, List[str]] = field(default_factory=dict)

    @property
    def has_data_indices(self) -> bool:
        return bool(self.data_index) and all(d is not None for d in self.data_index.values())


@dataclass
class Audit:
    """A run's ledger against a reference's (see the module docstring); keys are prompts (``key`` names which)."""

    key: str
    lost: Dict[int, int]
    duplicated: Dict[int, int]
    dropped: Dict[int, List[str]]
    misplaced: List[int]
    trained: int
    """Trainings in the audited run."""
    expected: int
    """Trainings in the reference run."""

    def counts(self) -> Dict[str, int]:
        return {"lost": sum(self.lost.values()), "duplicated": sum(self.duplicated.values()),
                "dropped": sum(len(r) for r in self.dropped.values()), "misplaced": len(self.misplaced),
                "trained": self.trained, "expected": self.expected}


def read_journal_lines(path: Path) -> List[dict]:
    """A journal's complete records (a torn last line, from a process killed inside a write, is left out)."""
    data = Path(path).read_bytes()
    return [json.loads(line) for line in data.split(b"\n")[:-1] if line.strip()]


def read_ledger(directory) -> RunLedger:
    """Every journal in ``directory`` (a run's ``fleet/`` folder, or a checkpoint's)."""
    out = RunLedger()
    for path in sorted(Path(directory).glob(JOURNALS)):
        records = read_journal_lines(path)
        if not records:
            continue
        header = records[0]
        indices = (header.get("meta") or {}).get("data_indices")
        for k, prompt in enumerate(header["prompts"]):
            out.data_index[prompt] = indices[k] if indices is not None and k < len(indices) else None
        for record in records[1:]:
            if record.get("op") == "train":
                out.trained[record["i"]] += 1
            elif record.get("op") in ("fail", "drop"):
                out.dropped.setdefault(record["i"], []).append(record.get("reason", ""))
    return out


def audit(reference_dir, run_dir) -> Audit:
    """The ledger in ``run_dir`` against the one in ``reference_dir`` (both ``fleet/`` folders of runs of the same
    command; the reference uninterrupted)."""
    ref, run = read_ledger(reference_dir), read_ledger(run_dir)
    by_data = ref.has_data_indices and run.has_data_indices

    def prompt(ledger: RunLedger, i: int) -> int:
        return ledger.data_index[i] if by_data else i

    want, got = Counter(), Counter()
    for i, times in ref.trained.items():
        want[prompt(ref, i)] += times
    for i, times in run.trained.items():
        got[prompt(run, i)] += times
    dropped: Dict[int, List[str]] = {}
    for i, reasons in run.dropped.items():
        dropped.setdefault(prompt(run, i), []).extend(reasons)
    lost = {p: n for p in want if (n := want[p] - got[p] - len(dropped.get(p, []))) > 0}
    duplicated = {p: got[p] - want[p] for p in got if got[p] > want[p]}
    misplaced = sorted(i for i in run.trained if by_data and i in ref.trained
                       and run.data_index[i] != ref.data_index[i])
    return Audit("data_index" if by_data else "prompt_id", lost, duplicated, dropped, misplaced,
                 sum(run.trained.values()), sum(ref.trained.values()))
