"""reasonrl.logging.plot renders real PNGs from metrics.jsonl of two synthetic runs."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from reasonrl.logging.plot import load_metrics, plot_runs, smooth

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EXPECTED = ["reward", "accuracy", "response_length", "kl", "entropy", "timing"]


def _write_run(run_dir: Path, slope: float, steps: int = 20) -> None:
    run_dir.mkdir(parents=True)
    with open(run_dir / "metrics.jsonl", "w") as f:
        for s in range(1, steps + 1):
            record = {"step": s, "reward/mean": slope * s / steps, "reward/accuracy": min(1.0, slope * s / steps),
                      "response_length/mean": 100 + 5 * s * slope, "actor/kl": 0.001 * s * slope,
                      "actor/entropy": 2.0 - 0.05 * s, "timing_s/rollout": 3.0, "timing_s/verify": 0.5,
                      "timing_s/update_actor": 2.0 * slope, "timing_s/step": 5.6 + 2.0 * slope}
            if s % 5 == 0:
                record["val/accuracy"] = 0.1 * s / 5
                record["val/reward_mean"] = 0.1 * s / 5
            f.write(json.dumps(record) + "\n")


def _has_color(png: Path, rgb: tuple) -> bool:
    """Whether any pixel is within 0.03 of the colour (matplotlib's C0 = #1f77b4, C1 = #ff7f0e)."""
    img = imread(png)[..., :3]
    target = np.array(rgb) / 255.0
    return bool((np.abs(img - target).max(axis=-1) < 0.03).any())


BLUE, ORANGE = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)


def test_two_runs_overlaid(tmp_path):
    _write_run(tmp_path / "run_a", slope=0.5)
    _write_run(tmp_path / "run_b", slope=1.0)
    written = plot_runs([tmp_path / "run_a", tmp_path / "run_b"], tmp_path / "plots")
    assert sorted(p.stem for p in written) == sorted(EXPECTED)
    digests = set()
    for name in EXPECTED:
        path = tmp_path / "plots" / f"{name}.png"
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC
        assert len(data) > 15_000, f"{name}.png is suspiciously small ({len(data)} bytes)"
        digests.add(hashlib.sha256(data).hexdigest())
    assert len(digests) == len(EXPECTED)  # every metric drew a different picture
    # Both runs are drawn: run_a in C0 blue, run_b in C1 orange.
    assert _has_color(tmp_path / "plots" / "reward.png", BLUE)
    assert _has_color(tmp_path / "plots" / "reward.png", ORANGE)
    # Timing has one stacked panel per run: 2 panels are 3.2*2+0.6 = 7.0 in tall at 110 dpi = 770 px.
    assert imread(tmp_path / "plots" / "timing.png").shape[0] == 770


def test_one_run_and_missing_metrics(tmp_path):
    run = tmp_path / "only_reward"
    run.mkdir()
    lines = [json.dumps({"step": s, "reward/mean": s / 10}) for s in (1, 2, 3)]
    lines.insert(1, "{not json")
    lines.append(json.dumps({"step": 2, "reward/mean": 0.9}))  # a resumed run repeats step 2: last wins
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match="skipped a line"):
        records = load_metrics(run)
    assert [(r["step"], r["reward/mean"]) for r in records] == [(1, 0.1), (2, 0.9), (3, 0.3)]
    with pytest.warns(UserWarning):
        written = plot_runs([run], tmp_path / "out")
    assert [p.name for p in written] == ["reward.png"]  # nothing else has data
    assert not _has_color(written[0], ORANGE)  # a single run: C0 only


def test_smooth_is_a_trailing_mean():
    # window 2 over [1, 3, 5]: [1/1, (1+3)/2, (3+5)/2] = [1, 2, 4]
    assert smooth([1.0, 3.0, 5.0], 2) == [1.0, 2.0, 4.0]
    assert smooth([1.0, 3.0], 1) == [1.0, 3.0]


def test_cli(tmp_path):
    _write_run(tmp_path / "r1", slope=1.0, steps=5)
    proc = subprocess.run([sys.executable, "-m", "reasonrl.logging.plot", str(tmp_path / "r1"), "--smooth", "3"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "r1" / "plots" / "kl.png").is_file()  # default --out for one run is RUN_DIR/plots
    assert len(proc.stdout.splitlines()) == 6
    missing = subprocess.run([sys.executable, "-m", "reasonrl.logging.plot", str(tmp_path / "nope")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no metrics.jsonl" in missing.stderr
