"""Learning a newcomer can see on a laptop: run the README's laptop command once and record its curve.

    python benchmarks/laptop_learning.py [--out benchmarks/results/laptop_learning.json] [-- key=value ...]

Runs ``python -m reasonrl.train task=arith trainer.profile=laptop`` (presets.LAPTOP_COMMAND; the settings live
in presets.LAPTOP_PROFILE) as a subprocess, with only ``trainer.output_dir`` (a fresh directory) and
``trainer.resume=never`` added, plus any overrides after ``--``. While it runs, this script watches the run's
``metrics.jsonl`` and stamps each new row with the wall seconds since launch; then it writes the curve (per step:
training reward, held-out accuracy where validated, wall seconds), the command, the machine (nproc, CPU model, load
average at start and end: the machine may be shared), the commit and the total wall time. Not a timed test: one real
run, its figures quoted in README.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from reasonrl.config.presets import LAPTOP_COMMAND, LAPTOP_PROFILE

ROOT = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (the platform's processor string elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def commit() -> Optional[str]:
    """The checkout's HEAD, with ``+dirty`` when tracked files differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def new_rows(path: Path, seen: int) -> List[Dict[str, Any]]:
    """The complete rows of ``metrics.jsonl`` after the first ``seen`` (a line still being written waits)."""
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[:-1]  # the text after the last newline is an unfinished row
    return [json.loads(line) for line in lines[seen:] if line.strip()]


def run(overrides: List[str], run_dir: Path, log_path: Path) -> Dict[str, Any]:
    """Launch the command, stamp each metrics row with the seconds since launch; the rows, exit status and wall."""
    command = shlex.split(LAPTOP_COMMAND) + [f"trainer.output_dir={run_dir}", "trainer.resume=never", *overrides]
    argv = [sys.executable, *command[1:]]  # "python" -> this interpreter
    metrics = run_dir / "metrics.jsonl"
    rows: List[Dict[str, Any]] = []
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        while True:
            done = proc.poll() is not None
            for row in new_rows(metrics, len(rows)):
                row["wall_s"] = round(time.monotonic() - start, 1)
                rows.append(row)
            if done:
                break
            time.sleep(1.0)
    return {"command": " ".join(command), "returncode": proc.returncode, "rows": rows,
            "wall_s": round(time.monotonic() - start, 1)}


def curve(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per logged step: the training reward, the held-out accuracy where validated, the wall seconds since launch."""
    out = []
    for r in rows:
        point: Dict[str, Any] = {"step": int(r["step"]), "wall_s": r["wall_s"]}
        for key, name in (("reward/mean", "reward"), ("val/accuracy", "val_accuracy"), ("timing_s/step", "step_s")):
            if r.get(key) is not None:
                point[name] = round(float(r[key]), 4)
        out.append(point)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "laptop_learning.json"))
    ap.add_argument("--run-dir", default=None, help="the run's directory (default: a fresh temporary one)")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides, after --")
    args = ap.parse_args(argv)
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="laptop_learning_"))
    run_dir.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    result = run(args.overrides, run_dir, run_dir / "train.log")
    load_end = os.getloadavg()
    points = curve(result["rows"])
    val = [(p["step"], p["val_accuracy"]) for p in points if "val_accuracy" in p]
    rewards = [p["reward"] for p in points if "reward" in p]
    half = len(rewards) // 2
    summary = {
        "val_accuracy_first_last": [val[0], val[-1]] if val else None,
        "reward_mean_first_half": round(sum(rewards[:half]) / half, 4) if half else None,
        "reward_mean_second_half": round(sum(rewards[half:]) / (len(rewards) - half), 4) if rewards[half:] else None,
        "val_prompts": LAPTOP_PROFILE["data"]["val_limit"],
    }
    report = {
        "benchmark": "laptop_learning",
        "command": result["command"],
        "profile": LAPTOP_PROFILE,
        "returncode": result["returncode"],
        "wall_s_total": result["wall_s"],
        "machine": {"nproc": os.cpu_count(), "cpu_model": cpu_model(), "platform": platform.platform(),
                    "loadavg_start": [round(x, 2) for x in load_start],
                    "loadavg_end": [round(x, 2) for x in load_end],
                    "note": "load average at start and end: the machine may be shared with other work"},
        "commit": commit(),
        "summary": summary,
        "curve": points,
        "run_dir": str(run_dir),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("command", "returncode", "wall_s_total", "summary")}, indent=1))
    return 0 if result["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
