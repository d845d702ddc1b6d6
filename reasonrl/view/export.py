"""``--export FILE.html``: the page with its script, style sheet and data in one file (no server, no network).

The data is what the API answers now: every run's metrics and health, and the first ``EXPORT_SAMPLE_ROWS`` rows of
each sample log (the page filters and pages them itself)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import List

from . import api
from .page import page_html
from .runs import Run

EXPORT_SAMPLE_ROWS = 5000


def export_html(runs: List[Run], out: Path, sample_rows: int = EXPORT_SAMPLE_ROWS) -> Path:
    """Write the self-contained page for ``runs`` to ``out`` (the run directories are only read)."""
    data = {
        "exported_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "info": api.runs_info(runs, {}),
        "metrics": [api.metrics(runs, {"run": str(i), "since": "0"}) for i in range(len(runs))],
        "health": [api.run_health(runs, {"run": str(i)}) for i in range(len(runs))],
        "samples": [r.sample_query.head(sample_rows) for r in runs],
    }
    out = Path(out)
    out.write_text(page_html(inline_data=data), encoding="utf-8")
    return out
