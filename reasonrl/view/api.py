"""The JSON API over the runs, as plain functions of the query (the server maps URLs to them; the export calls them
once). Every answer is a JSON-able dict; a bad query raises ApiError with the HTTP status and a message."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping

from .curves import X_AXES, chart_specs
from .health import health
from .prompt_steps import UnknownPrompt, prompt_across_steps
from .runs import Run
from .samples import number_param


class ApiError(ValueError):
    """A query the API cannot answer: ``status`` (400, 404) and a message naming the parameter."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _int(params: Mapping[str, str], key: str, default: int) -> int:
    try:
        value = number_param(params, key)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    if value is None:
        return default
    if not value.is_integer():
        raise ApiError(400, f"parameter {key}={params[key]!r} is not an integer")
    return int(value)


def pick_run(runs: List[Run], params: Mapping[str, str]) -> Run:
    index = _int(params, "run", 0)
    if not 0 <= index < len(runs):
        raise ApiError(404, f"no run {index}: runs are 0..{len(runs) - 1}")
    return runs[index]


def runs_info(runs: List[Run], params: Mapping[str, str]) -> Dict[str, Any]:
    """``/api/runs``: the runs, the charts and the x axes."""
    return {"runs": [{"id": i, "label": r.label, "path": str(r.path)} for i, r in enumerate(runs)],
            "charts": chart_specs(), "x_axes": X_AXES}


def metrics(runs: List[Run], params: Mapping[str, str]) -> Dict[str, Any]:
    """``/api/metrics?run=I&since=N&generation=G``: the records from position N on (all with ``reset`` when the
    file was read again from its start), and the cursor ``next``/``generation`` for the next poll."""
    run = pick_run(runs, params)
    return run.metrics.since(_int(params, "since", 0), _int(params, "generation", run.metrics.tail.generation))


def run_health(runs: List[Run], params: Mapping[str, str]) -> Dict[str, Any]:
    """``/api/health?run=I``: the alarms and the checkpoints with their verification."""
    run = pick_run(runs, params)
    return health(run.metrics, run.samples, run.path)


def samples(runs: List[Run], params: Mapping[str, str]) -> Dict[str, Any]:
    """``/api/samples?run=I&<filters>&offset=&limit=``: a page of the sample log (filters in ``view.samples``)."""
    run = pick_run(runs, params)
    try:
        return run.sample_query.query(params)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None


def prompt(runs: List[Run], params: Mapping[str, str]) -> Dict[str, Any]:
    """``/api/prompt?run=I&key=K&a=P&b=P``: prompt K's samples by step and a word diff of two
    (``view.prompt_steps``)."""
    run = pick_run(runs, params)
    try:
        return prompt_across_steps(run.sample_query, params)
    except UnknownPrompt as exc:
        raise ApiError(404, str(exc)) from None
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None


ROUTES = {"/api/runs": runs_info, "/api/metrics": metrics, "/api/health": run_health, "/api/samples": samples,
          "/api/prompt": prompt}
