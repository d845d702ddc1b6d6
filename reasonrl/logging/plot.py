"""Plot runs from their metrics.jsonl: ``python -m reasonrl.logging.plot RUN_DIR [RUN_DIR ...] [--out DIR]``.

Writes reward.png, accuracy.png, response_length.png, kl.png, entropy.png (several runs overlaid, one legend
entry per run; validation points dashed with markers) and timing.png (per-phase ``timing_s/<phase>`` stacked,
one panel per run, with ``timing_s/step`` drawn on top as the total). A plot whose metric no run has is skipped.
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


@dataclass(frozen=True)
class PlotSpec:
    """One line plot: the training metric, and which validation keys join it."""

    name: str
    """File stem of the PNG."""
    title: str
    """Figure title."""
    key: str
    """Training metric key in metrics.jsonl."""
    val_suffixes: Tuple[str, ...] = ()
    """Keys ``val/...<suffix>`` are drawn too, dashed with markers."""


LINE_PLOTS: Tuple[PlotSpec, ...] = (
    PlotSpec("reward", "Mean reward", "reward/mean", ("reward/mean", "reward_mean")),
    PlotSpec("accuracy", "Accuracy (fraction of correct responses)", "reward/accuracy", ("accuracy",)),
    PlotSpec("response_length", "Mean response length (tokens)", "response_length/mean"),
    PlotSpec("kl", "KL(actor || reference)", "actor/kl"),
    PlotSpec("entropy", "Policy entropy", "actor/entropy"),
)
TOTAL_TIME_KEY = "timing_s/step"


@dataclass
class Run:
    """One run's metrics, one record per step (the last record wins when a resumed run repeated a step)."""

    label: str
    records: List[dict]

    def series(self, key: str) -> Tuple[List[int], List[float]]:
        steps, values = [], []
        for record in self.records:
            value = record.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                steps.append(record["step"])
                values.append(float(value))
        return steps, values

    def keys(self) -> List[str]:
        seen: Dict[str, None] = {}
        for record in self.records:
            seen.update(dict.fromkeys(record))
        return list(seen)


def load_metrics(run_dir: str | Path) -> List[dict]:
    """Records of ``<run_dir>/metrics.jsonl`` (or of that file itself), sorted by step, bad lines skipped."""
    path = Path(run_dir)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics.jsonl at {path} (pass a run directory: the trainer.output_dir of a run)")
    by_step: Dict[int, dict] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            by_step[int(record["step"])] = record
        except (ValueError, KeyError, TypeError):
            warnings.warn(f"{path}:{lineno}: skipped a line that is not a JSON object with a step")
    return [by_step[s] for s in sorted(by_step)]


def _labels(run_dirs: Sequence[str | Path]) -> List[str]:
    names = [Path(d).resolve().name for d in run_dirs]
    if len(set(names)) == len(names):
        return names
    return [str(d) for d in run_dirs]


def smooth(values: List[float], window: int) -> List[float]:
    """Trailing moving average over ``window`` points (window <= 1: unchanged)."""
    if window <= 1:
        return list(values)
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _line_plot(runs: List[Run], spec: PlotSpec, out: Path, window: int) -> Optional[Path]:
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    drawn = 0
    for i, run in enumerate(runs):
        color = f"C{i % 10}"
        steps, values = run.series(spec.key)
        if steps:
            if window > 1:
                ax.plot(steps, values, color=color, alpha=0.25, linewidth=1)
            ax.plot(steps, smooth(values, window), color=color, linewidth=1.8, label=run.label)
            drawn += 1
        if spec.val_suffixes:
            for key in run.keys():
                if key.startswith("val/") and key.endswith(spec.val_suffixes):
                    vsteps, vvalues = run.series(key)
                    if vsteps:
                        ax.plot(vsteps, vvalues, "o--", color=color, linewidth=1.2, markersize=4,
                                label=f"{run.label} {key}")
                        drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.set_title(f"{spec.title}  [{spec.key}]" + (f"  (moving average of {window})" if window > 1 else ""))
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / f"{spec.name}.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def _phases(run: Run) -> List[str]:
    return [k for k in run.keys() if k.startswith("timing_s/") and k != TOTAL_TIME_KEY]


def _timing_plot(runs: List[Run], out: Path) -> Optional[Path]:
    runs = [r for r in runs if _phases(r)]
    if not runs:
        return None
    phase_order: Dict[str, None] = {}
    for run in runs:
        phase_order.update(dict.fromkeys(_phases(run)))
    colors = {p: f"C{i % 10}" for i, p in enumerate(phase_order)}
    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 3.2 * len(runs) + 0.6), dpi=110, sharex=True, squeeze=False)
    for ax, run in zip(axes[:, 0], runs):
        steps = [r["step"] for r in run.records]
        phases = _phases(run)
        stacks = [[float(r.get(p) or 0.0) for r in run.records] for p in phases]
        ax.stackplot(steps, stacks, labels=[p.split("/", 1)[1] for p in phases], colors=[colors[p] for p in phases],
                     alpha=0.85)
        tsteps, totals = run.series(TOTAL_TIME_KEY)
        if tsteps:
            ax.plot(tsteps, totals, color="black", linewidth=1.2, label="step (total)")
        top = max([sum(col) for col in zip(*stacks)] + totals + [1e-9])
        ax.set_ylim(0, top * 1.35)  # headroom for the legend
        ax.set_title(f"Time per phase: {run.label}")
        ax.set_ylabel("seconds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", ncol=3)
    axes[-1, 0].set_xlabel("step")
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    path = out / "timing.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_runs(run_dirs: Sequence[str | Path], out_dir: str | Path, smooth_window: int = 1) -> List[Path]:
    """Write every plot that has data; returns the PNG paths written."""
    if not run_dirs:
        raise ValueError("give at least one run directory")
    runs = [Run(label, load_metrics(d)) for label, d in zip(_labels(run_dirs), run_dirs)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [_line_plot(runs, spec, out, smooth_window) for spec in LINE_PLOTS]
    written.append(_timing_plot(runs, out))
    return [p for p in written if p is not None]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reasonrl.logging.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (each has metrics.jsonl)")
    parser.add_argument("--out", default=None,
                        help="where PNGs go (default: RUN_DIR/plots for one run, ./plots for several)")
    parser.add_argument("--smooth", type=int, default=1, help="moving-average window in steps (default 1: raw)")
    args = parser.parse_args(argv)
    out = args.out or (str(Path(args.runs[0]) / "plots") if len(args.runs) == 1 else "plots")
    try:
        written = plot_runs(args.runs, out, args.smooth)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not written:
        print("nothing to plot: no run has reward, accuracy, length, KL, entropy or timing metrics", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
