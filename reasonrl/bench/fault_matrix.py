"""The fleet's fault matrix (issue #47 item 4; docs/fleet.md): ``python -m reasonrl.train`` with
``trainer.mode=async fleet.enabled=true`` (2 replicas on Ray, CPU, a tiny policy), killed with SIGKILL at a fault point
(``REASONRL_FAULT_AT``, reasonrl/fault_points.py) in the trainer (the driver), in a replica or in both, resumed to the
end with the same command (``trainer.resume=auto``), and its ledger compared with an uninterrupted run's
(``fleet.audit``): 0 lost and 0 duplicated prompts, or the reason each missing one was dropped.

``benchmarks/fleet_faults.py`` runs every case of ``CASES`` and writes the table; ``tests/e2e/test_fleet_faults.py``
runs two of them. A run: ``TOTAL_STEPS`` steps of 4 prompts x 2 samples, a checkpoint every ``SAVE_EVERY`` steps, so a
kill after step 2's checkpoint leaves up to two rounds trained in the run's ledger that no checkpoint holds.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from reasonrl.fleet.audit import audit, read_ledger

TOTAL_STEPS = 4
SAVE_EVERY = 2
ARGS = ["task=arith", "rollout.engine=hf", "data.train_batch_size=4", "rollout.n=2", "rollout.max_new_tokens=8",
        "actor.micro_batch_size_per_worker=8", "reward.workers=1", "trainer.logger=[jsonl]", "trainer.mode=async",
        "algorithm.use_kl_loss=false", "fleet.enabled=true", "async_rollout.num_rollout_workers=2",
        "fleet.max_restarts=3", f"trainer.total_steps={TOTAL_STEPS}", f"trainer.save_every={SAVE_EVERY}"]
KILLED = -9
"""The exit status of a run that a ``sigkill`` fault point stopped (subprocess: minus the signal)."""
RESUMED = re.compile(r"resumed from \S+ at step (\d+)")


@dataclass(frozen=True)
class Case:
    kill: str
    """Which process the fault kills: ``trainer`` (the driver, and Ray with it), ``replica`` or ``both``."""
    fault: str
    """``REASONRL_FAULT_AT`` of the interrupted run (a count ``#k``: the k-th arrival in that process)."""
    where: str
    """The place, in words."""

    @property
    def resumes(self) -> bool:
        """The run stops and is resumed (a replica alone is replaced while the run goes on)."""
        return self.kill != "replica"


CASES: List[Case] = [
    Case("trainer", "step.round_taken#3=sigkill", "step 3's round verified, before the update"),
    Case("trainer", "step.updated#3=sigkill", "step 3 updated, before its weights are published"),
    Case("trainer", "step.published#4=sigkill",
         "step 4 published (rounds 3 and 4 trained in the run's ledger), before its checkpoint"),
    Case("trainer", "fleet.ledger_saved#2=sigkill", "inside step 4's checkpoint: the journals copied, workers' not"),
    Case("trainer", "checkpoint.written#2=sigkill", "inside step 4's checkpoint: every file but trainer_state.json"),
    Case("trainer", "fleet.round_issued#3=sigkill", "step 3's prompts all in flight on the replicas"),
    Case("replica", "fleet.replica1.generate#2=sigkill", "replica1 as step 2's round reaches it"),
    Case("replica", "fleet.replica0.load_published#2=sigkill", "replica0 as step 2's weights reach it"),
    Case("both", "fleet.replica1.generate#3=sigkill,fleet.replica_lost#1=sigkill",
         "replica1 in step 3's round, the trainer as it revokes replica1's prompts"),
    Case("both", "fleet.replica1.generate#4=sigkill,step.published#4=sigkill",
         "replica1 in step 4's round (re-issued, replaced), the trainer after step 4's publish"),
    Case("both", "fleet.replica1.generate#2=sigkill,step.published#3=sigkill",
         "replica1 in step 2's round (its restart in step 2's checkpoint), the trainer after step 3's publish"),
]


@dataclass
class Train:
    returncode: int
    output: str
    seconds: float


def train(out: Path, policy: str, fault: str = "", timeout_s: float = 600.0, extra: Sequence[str] = ()) -> Train:
    """The training command on the matrix's settings (then ``extra`` overrides) into ``out`` (resuming what is
    there), ``fault`` planned; in a session of its own, so a ``sigkill`` takes its whole group, as ``kill -9`` of a
    terminal's job does."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    env.pop("REASONRL_FAULT_AT", None)
    if fault:
        env["REASONRL_FAULT_AT"] = fault
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "reasonrl.train", *ARGS, *extra, f"model.path={policy}",
                           f"trainer.output_dir={out}"], capture_output=True, text=True, timeout=timeout_s, env=env,
                          start_new_session=True)
    return Train(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start)


def reference_run(out: Path, policy: str, extra: Sequence[str] = ()) -> Train:
    """The uninterrupted run; RuntimeError with its output's tail when it fails."""
    run = train(out, policy, extra=extra)
    if run.returncode != 0:
        raise RuntimeError(f"the uninterrupted run failed ({run.returncode}):\n{run.output[-3000:]}")
    return run


def run_case(case: Case, out: Path, policy: str, reference: Path, extra: Sequence[str] = ()) -> Dict[str, Any]:
    """The case's interrupted run, then its resume to the end (when it stopped), audited against ``reference`` (the
    uninterrupted run's directory): one row of the matrix. ``extra``: overrides of both runs (the mode)."""
    first = train(out, policy, case.fault, extra=extra)
    runs = [first]
    trained_at_kill = sum(read_ledger(out / "fleet").trained.values())  # in the run's ledger as the run stopped
    resumed_step: Optional[int] = None
    if case.resumes:
        second = train(out, policy, extra=extra)
        runs.append(second)
        found = RESUMED.search(second.output)
        resumed_step = int(found.group(1)) if found else 0  # no checkpoint to resume: started again at step 0
    counts = audit(reference / "fleet", out / "fleet").counts()
    steps = [row["step"] for row in _rows(out / "metrics.jsonl")]
    last = (_rows(out / "metrics.jsonl") or [{}])[-1]
    expect_first = KILLED if case.resumes else 0
    row = {"kill": case.kill, "point": case.fault, "where": case.where,
           "interrupted_exit": first.returncode, "faults_hit": re.findall(r"fault point (\S+): sigkill", first.output),
           "final_exit": runs[-1].returncode, "trained_at_kill": trained_at_kill, "resumed_step": resumed_step,
           "lost": counts["lost"], "duplicated": counts["duplicated"], "dropped": counts["dropped"],
           "misplaced": counts["misplaced"], "trained": counts["trained"], "expected": counts["expected"],
           "steps_logged": steps, "restarts": last.get("fleet/restarts"),
           "wall_s": round(sum(r.seconds for r in runs), 1)}
    row["ok"] = (first.returncode == expect_first and runs[-1].returncode == 0 and counts["lost"] == 0
                 and counts["duplicated"] == 0 and counts["misplaced"] == 0 and counts["trained"] == counts["expected"]
                 and steps == list(range(1, TOTAL_STEPS + 1)))
    if not row["ok"]:
        row["output_tail"] = [r.output[-2000:] for r in runs]
    return row


def table(rows: List[Dict[str, Any]]) -> str:
    """The matrix as a Markdown table."""
    lines = ["| kill | fault point(s) | trained at kill | resumed at | lost | duplicated | dropped | restarts | wall s "
             "| ok |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        resumed = "-" if r["resumed_step"] is None else f"step {r['resumed_step']}"
        restarts = "-" if r["restarts"] is None else int(r["restarts"])
        lines.append(f"| {r['kill']} | `{r['point']}` | {r['trained_at_kill']} | {resumed} | {r['lost']} "
                     f"| {r['duplicated']} | {r['dropped']} | {restarts} | {r['wall_s']} | {'yes' if r['ok'] else 'NO'} |")
    return "\n".join(lines)


def _rows(path: Path) -> List[Dict[str, Any]]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
