"""The fleet's ledger on disk and one round's bookkeeping over it (pure: no Ray), for both fleet sources
(``FleetSource``, ``ContinuousSource``) and ``replicas.Replicas``: the ledger's folder (``fleet.ledger``: one journal
per round, ``<output_dir>/fleet/round_<step>.jsonl``, and the run's restarts journal), copied into each checkpoint with
the fleet's counters (``save_fleet``/``load_fleet``); ``FleetRound``, which replica holds which prompt of a round and
what was issued again; and the end of a round: which prompts cannot be trained on (``untrainable_groups``) and the
journal marked when the round is trained (``mark_trained``).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Collection, Dict, List, Optional, Sequence, Tuple

from reasonrl.fault_points import fault_point
from reasonrl.fleet.ledger import DONE, ISSUED, Ledger
from reasonrl.fleet.router import RouteRequest, Router

LEDGER_DIR = "fleet"
"""The ledger's folder, in the run directory and in each checkpoint."""
STATE_FILE = "fleet_state.json"
"""The fleet's counters in a checkpoint (restarts, re-issued prompts)."""
RESTARTS_FILE = "restarts.jsonl"
"""The run's restarts, one fsync'd line each as it is booked, in the ledger's folder: past the last checkpoint too, so
a resume of the same run directory keeps the restarts made after its checkpoint (the budget is per run)."""

Issued = Tuple[int, int]
"""A prompt's position in its round and the attempt issued."""



def journal_step(path: Path) -> int:
    """The step of ``round_<step>.jsonl``."""
    return int(Path(path).stem[len("round_"):])


def drop_rounds_from(directory: Path, step: int) -> List[int]:
    """Remove the journals of rounds ``step`` and later from ``directory``; their steps."""
    dropped = sorted(journal_step(p) for p in Path(directory).glob("round_*.jsonl") if journal_step(p) >= step)
    for s in dropped:
        (Path(directory) / f"round_{s:06d}.jsonl").unlink()
    return dropped


def read_restarts(path: Path) -> List[dict]:
    """The restarts journal's complete lines (a torn last line, from a process killed inside a write, left out)."""
    if not Path(path).exists():
        return []
    lines = Path(path).read_bytes().split(b"\n")[:-1]
    return [json.loads(line) for line in lines if line.strip()]


def append_restart(path: Path, record: dict) -> None:
    """One restart on the journal ``path``, durable when this returns."""
    with open(path, "ab") as f:
        f.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())


def round_ledger(path: Path) -> Ledger:
    """The ledger of one round from its journal (its header names the round and its prompts)."""
    with open(path, "rb") as f:
        header = json.loads(f.readline())
    return Ledger.open(path, header["epoch"], header["prompts"])


def ledger_summary(directory: Path) -> Dict[str, int]:
    """Every round's prompts by state, summed over the journals in ``directory`` (the run's or a checkpoint's)."""
    totals: Dict[str, int] = {}
    for path in sorted(Path(directory).glob("round_*.jsonl")):
        ledger = round_ledger(path)
        for state, count in ledger.counts().items():
            totals[state] = totals.get(state, 0) + count
        ledger.close()
    return totals


class FleetRound:
    """One round's bookkeeping: which replica holds which prompts, re-issues counted (pure, no Ray)."""

    def __init__(self, step: int, count: int, n: int, router: Router, ledger: Ledger) -> None:
        self.step, self.count, self.n, self.router, self.ledger = step, count, n, router, ledger
        self.reissued: List[int] = []

    def prompt_id(self, k: int) -> int:
        return self.step * self.count + k

    def assign(self, positions: Sequence[int], avoid: Optional[Dict[int, str]] = None,
               among: Optional[Collection[str]] = None) -> Dict[str, List[Issued]]:
        """Route each prompt position (its ``n`` samples together) to a replica taking work and issue it in the
        ledger; replica -> its (position, attempt) pairs. ``avoid``: prompt id -> a replica to keep it off when
        another takes work (where it just raised); ``among``: the replicas to prefer (``Router.assign``)."""
        out: Dict[str, List[Issued]] = {}
        for k in positions:
            attempt = self.ledger.state(self.prompt_id(k)).attempt + 1
            name = self.router.assign(RouteRequest(f"{self.step}:{k}:{attempt}", group=f"{self.step}:{k}", n=self.n),
                                      avoid=(avoid or {}).get(self.prompt_id(k)), among=among)
            out.setdefault(name, []).append((k, self.ledger.issue(self.prompt_id(k), name)))
        return out

    def answered(self, name: str, issued: Sequence[Issued], samples: Dict[int, int]) -> List[int]:
        """``name``'s answer for ``issued`` ((position, attempt) pairs; ``samples``: position -> samples it returned):
        the positions whose attempt was the one in flight, now done (replica and sample count in the ledger's
        payload); a late or second answer changes nothing."""
        kept = []
        for k, attempt in issued:
            self.router.complete(f"{self.step}:{k}:{attempt}")
            if self.ledger.complete(self.prompt_id(k), attempt, {"replica": name, "samples": samples.get(k, 0)}):
                kept.append(k)
        return kept

    def retry(self, name: str, issued: Sequence[Issued], cause: str) -> List[int]:
        """``name``'s call of ``issued`` raised: those still in flight revoked (to be issued again), their requests
        leave the router; their positions."""
        positions = []
        for k, attempt in issued:
            self.router.complete(f"{self.step}:{k}:{attempt}")
            state = self.ledger.state(self.prompt_id(k))
            if state.state == ISSUED and state.attempt == attempt:
                self.ledger.revoke(self.prompt_id(k), f"replica {name}: {cause}")
                positions.append(k)
        self.reissued.extend(positions)
        return positions

    def lost(self, name: str, cause: str) -> List[int]:
        """``name`` is gone: its prompts in flight revoked (to be issued again), it leaves the router."""
        ids = self.ledger.replica_lost(name, cause)
        self.router.remove(name)
        positions = [i - self.step * self.count for i in ids]
        self.reissued.extend(positions)
        return positions


def save_fleet(ledger_dir: Path, directory: str, restarts: int, reissued: int) -> None:
    """Into the checkpoint ``directory``: the ledger's folder (round journals, restarts journal) and the counters."""
    shutil.copytree(ledger_dir, Path(directory) / LEDGER_DIR, dirs_exist_ok=True)
    fault_point("fleet.ledger_saved")
    (Path(directory) / STATE_FILE).write_text(json.dumps({"restarts": restarts, "reissued": reissued}))


def load_fleet(ledger_dir: Path, directory: str) -> Optional[Tuple[int, int]]:
    """From the checkpoint ``directory``: its ledger replaces the run's in ``ledger_dir`` (rounds drawn after it were
    not trained: they are drawn again); the (restarts, re-issued) counters to resume with, None when it holds none.
    The restarts are the run's: those the run's restarts journal holds past the checkpoint (a replica replaced after
    it, then the trainer stopped) still count against the budget, and the journal keeps them."""
    spent = read_restarts(Path(ledger_dir) / RESTARTS_FILE)  # read before the checkpoint's folder replaces it
    source = Path(directory) / LEDGER_DIR
    if source.is_dir():
        shutil.rmtree(ledger_dir, ignore_errors=True)
        shutil.copytree(source, ledger_dir)
    state_file = Path(directory) / STATE_FILE
    if not state_file.exists():
        return None
    state = json.loads(state_file.read_text())
    restarts = state["restarts"]
    if len(spent) > restarts:
        Path(ledger_dir).mkdir(parents=True, exist_ok=True)
        (Path(ledger_dir) / RESTARTS_FILE).unlink(missing_ok=True)
        for record in spent:
            append_restart(Path(ledger_dir) / RESTARTS_FILE, record)
        restarts = len(spent)
    return restarts, state["reissued"]


Trainable = Tuple[Path, Dict[int, str]]
"""A round returned to the loop: its journal, and the positions it cannot train on with the reason of each."""


def untrainable_groups(samples: Sequence[Any]) -> Dict[int, str]:
    """The round's positions (``Sample.group``) whose every sample failed verification: the loop leaves failed samples
    out of the advantages and the loss, so such a prompt is not trained on; each with its reason (the first sample's
    verifier and its failure)."""
    by_group: Dict[int, List[Any]] = {}
    for s in samples:
        by_group.setdefault(s.group, []).append(s)
    out = {}
    for k, group in sorted(by_group.items()):
        if all(getattr(s.result, "failed", False) for s in group):
            info = getattr(group[0].result, "info", None) or {}
            why = info.get("reason", "")  # a poison prompt's reason says it all (``fleet.poison``)
            out[k] = why if info.get("poison") else f"every sample failed verification ({group[0].verifier}: {why})"
            out[k] = out[k][:300]
    return out


def mark_trained(trainable: Optional[Trainable]) -> None:
    """The round just trained on (``trainable``: its journal and its untrainable positions): every done prompt marked
    ``trained``, but those positions, marked dropped (``failed``) with their reason."""
    if trainable is None:
        return
    path, dropped = trainable
    ledger = round_ledger(path)
    done = set(ledger.in_state(DONE))
    for k, index in enumerate(ledger.prompts):
        if index in done:
            if k in dropped:
                ledger.drop(index, dropped[k])
            else:
                ledger.trained(index)
    ledger.close()
