"""The fleet's fault matrix -> benchmarks/results/fleet_fault_matrix.json (issue #47 item 4; docs/fleet.md).

    python benchmarks/fleet_faults.py [--cases 0,2,8] [--out benchmarks/results/fleet_fault_matrix.json]
    python benchmarks/fleet_faults.py --set fleet.continuous=true --set async_rollout.max_staleness=1 \
        --out benchmarks/results/fleet_fault_matrix_continuous.json      # the same cases, generating continuously

One uninterrupted run of ``python -m reasonrl.train`` with ``trainer.mode=async fleet.enabled=true`` (2 replicas on
Ray, CPU, a 2-layer random Llama with SmolLM2's tokenizer: plumbing, not learning; 4 steps of 4 prompts x 2 samples,
a checkpoint every 2), then per case of ``reasonrl/bench/fault_matrix.py``'s ``CASES`` the same command killed with
SIGKILL at a fault point (in the trainer, a replica, or both), resumed to the end when it stopped, and its ledger
(``<run>/fleet/``) compared with the uninterrupted run's (``reasonrl/fleet/audit.py``): prompts lost, duplicated and
dropped with a reason, per dataset position. One row per case: the kill, the point, the step resumed from, the counts,
the fleet's restarts at the end, the wall seconds of the case's runs.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from reasonrl.bench.fault_matrix import ARGS, CASES, reference_run, run_case, table

REPO = Path(__file__).resolve().parents[1]


def tiny_policy(directory: Path) -> str:
    """The tests' tiny policy (seconds to build): 2 random layers, SmolLM2's tokenizer."""
    from reasonrl.bench.shapes import tiny_policy as build
    from reasonrl.models import resolve_model_path

    return build(directory, resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="", help="comma-separated indices into CASES (default: all)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "fleet_fault_matrix.json"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override of every run (the mode: fleet.continuous=true async_rollout.max_staleness=1)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    chosen = [CASES[int(i)] for i in args.cases.split(",")] if args.cases else CASES
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fleet-faults-") as tmp:
        work = Path(tmp)
        policy = tiny_policy(work / "policy")
        reference = work / "reference"
        ref = reference_run(reference, policy, args.set)
        print(f"uninterrupted run: {ref.seconds:.1f} s", flush=True)
        rows = []
        for k, case in enumerate(chosen):
            row = run_case(case, work / f"case{k}", policy, reference, args.set)
            print(f"{case.kill:8s} {case.fault:70s} lost {row['lost']} duplicated {row['duplicated']} dropped "
                  f"{row['dropped']} resumed {row['resumed_step']} {row['wall_s']} s {'ok' if row['ok'] else 'NO'}",
                  flush=True)
            rows.append(row)
    result = {"what": "fleet fault matrix: SIGKILL of the trainer, a replica or both at fault points, resumed, the "
                      "ledger against an uninterrupted run's (reasonrl/bench/fault_matrix.py)",
              "command": "python -m reasonrl.train " + " ".join([*ARGS, *args.set]) + " model.path=<tiny policy>",
              "machine": {"host": platform.node(), "cpus": os.cpu_count(), "load_1m": os.getloadavg()[0]},
              "reference_wall_s": round(ref.seconds, 1), "total_wall_s": round(time.monotonic() - started, 1),
              "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(table(rows))
    print(f"{sum(r['ok'] for r in rows)}/{len(rows)} cases: 0 lost, 0 duplicated; {result['total_wall_s']} s; "
          f"-> {args.out}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
