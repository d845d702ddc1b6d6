"""``python -m reasonrl.view RUN_DIR [RUN_DIR ...]``: a local web page over runs (docs/view.md).

Curves of every metric family (several runs overlaid), the run's alarms and checkpoints, and a browser over the
sample log, filtered and paged by the server; new steps appear as the trainer writes them. The modules, one job
each: jsonl_tail (new complete lines of a growing file), metrics_log, samples (the sample log's index and filters),
checkpoints, health, curves (which charts), runs (what a run directory is), api (the JSON answers), page and
static/ (the page and its script), server, export, cli. Reads run directories only; no torch or ray at import.
"""
