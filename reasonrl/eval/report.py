"""The printed table of an evaluation summary: one line overall, then one per data_source / subject / level."""
from __future__ import annotations

from typing import Any, Dict, List

from .metrics import BREAKDOWN_KEYS


def format_table(summary: Dict[str, Any]) -> str:
    """A fixed-width text table of ``summary["metrics"]`` (as written by ``run_eval``)."""
    ks = summary["k"]
    metrics = summary["metrics"]
    columns = ["problems", "samples", "mean_acc"] + [f"pass@{k}" for k in ks] + [f"maj@{k}" for k in ks] + ["timeouts", "failed"]
    lines: List[List[str]] = []

    def add(label: str, block: Dict[str, Any]) -> None:
        cells = [label, str(block["problems"]), str(block["samples"]), f"{block['mean_accuracy']:.4f}"]
        cells += [f"{block[f'pass@{k}']:.4f}" for k in ks] + [f"{block[f'maj@{k}']:.4f}" for k in ks]
        cells += [str(block["timed_out"]), str(block.get("failed", block["timed_out"]))]
        lines.append(cells)

    add("overall", metrics["overall"])
    for key in BREAKDOWN_KEYS:
        for value, block in metrics.get(f"by_{key}", {}).items():
            add(f"{key}={value}", block)
    header = ["group"] + columns
    widths = [max(len(row[i]) for row in [header] + lines) for i in range(len(header))]
    fmt = lambda row: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
    title = (f"{summary['task']} ({summary['split']}) | model {summary['model']} | n={summary['n']} "
             f"temperature={summary['temperature']} max_new_tokens={summary['max_new_tokens']}")
    rule = "-" * max(len(title), len(fmt(header)))
    return "\n".join([title, rule, fmt(header), rule] + [fmt(row) for row in lines] + [rule])
