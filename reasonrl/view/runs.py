"""The run directories the viewer serves: each checked once to be a run (it holds ``metrics.jsonl``,
``samples.jsonl`` or ``checkpoints/``), labelled by its folder name, with its metrics log and sample index."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Sequence

from reasonrl.logging.sample_log import SAMPLE_LOG

from .metrics_log import METRICS_FILE, MetricsLog
from .sample_index import SampleIndex
from .sample_query import SampleQuery

RUN_MARKERS = (METRICS_FILE, SAMPLE_LOG, "checkpoints")


class NotARun(ValueError):
    """A path given as a run directory that is not one; the message names it and what a run holds."""


@dataclass
class Run:
    """One run directory being viewed."""

    label: str
    path: Path
    metrics: MetricsLog = field(init=False)
    samples: SampleIndex = field(init=False)
    sample_query: SampleQuery = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = MetricsLog(self.path)
        self.samples = SampleIndex(self.path)
        self.sample_query = SampleQuery(self.samples)


def check_run_dir(path: str | Path) -> Path:
    """``path`` as a run directory, or NotARun naming it."""
    p = Path(path)
    if not str(path).strip():
        raise NotARun("an empty path is not a run directory (pass a run's trainer.output_dir)")
    if not p.is_dir():
        raise NotARun(f"{path}: not a directory (pass a run directory: a run's trainer.output_dir)")
    if not any((p / m).exists() for m in RUN_MARKERS):
        raise NotARun(f"{path}: not a run directory: it holds none of {', '.join(RUN_MARKERS)} "
                      "(pass a run's trainer.output_dir)")
    return p


def open_runs(paths: Sequence[str | Path]) -> List[Run]:
    """The runs at ``paths`` (NotARun for the first that is not one), labelled by folder name, or by the path as given
    when two folder names are the same."""
    if not paths:
        raise NotARun("give at least one run directory")
    dirs = [check_run_dir(p) for p in paths]
    names = [d.resolve().name for d in dirs]
    labels = names if len(set(names)) == len(names) else [str(p) for p in paths]
    return [Run(label, d) for label, d in zip(labels, dirs)]
