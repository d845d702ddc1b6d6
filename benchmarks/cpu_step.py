"""Per-phase seconds of the default training command on this machine -> benchmarks/results/cpu_step.json.

    python benchmarks/cpu_step.py [--steps 3] [key=value ...]

Runs ``python -m reasonrl.train task=gsm8k`` (the CPU profile applies with no GPU) for a few steps in a temporary
output dir, then reports each step's ``timing_s/*`` and throughput from metrics.jsonl, plus wall time to the
first finished step (start-up included).
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "cpu_step.json")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "reasonrl.train", "task=gsm8k", f"trainer.total_steps={args.steps}",
               f"trainer.output_dir={run_dir}", "trainer.save_every=0", *args.overrides]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        first_step_s = None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            sys.stdout.write(line)
            metrics_file = run_dir / "metrics.jsonl"  # created empty at start; the first step's line marks it
            if first_step_s is None and metrics_file.exists() and metrics_file.stat().st_size > 0:
                first_step_s = time.perf_counter() - start
        proc.wait()
        total_s = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"training failed ({proc.returncode}):\n{''.join(lines[-40:])}")
        steps = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
    phases = sorted({k for s in steps for k in s if k.startswith("timing_s/")})
    result = {
        "command": " ".join(cmd[1:]),
        "machine": {"cpus": __import__("os").cpu_count(), "platform": platform.platform()},
        "wall_s_to_first_step": first_step_s,
        "wall_s_total": total_s,
        "steps": [{k: s[k] for k in ["step", *phases, "perf/tokens_per_s", "perf/rollout_tokens_per_s",
                                     "response_length/mean"] if k in s} for s in steps],
        "mean_after_first": {k: sum(s[k] for s in steps[1:]) / max(1, len(steps) - 1) for k in phases}
        if len(steps) > 1 else {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
