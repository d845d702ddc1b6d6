"""The run viewer on a real trained run (the session's ``trained_run``, tests/conftest.py: 2 PPO steps of the real
SmolLM2 on ``task=math_tool`` in this process, the hf engine), its run directory served: the curves, health and
samples endpoints answer that run's own steps and samples, read back against the files the trainer wrote."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest
from view_serving import get_json as get, serving

from reasonrl.view.runs import open_runs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(trained_run: Path) -> Iterator[str]:
    with serving(open_runs([trained_run])) as url:
        yield url


def lines(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_viewer_shows_the_trained_runs_steps_and_samples(served: str, trained_run: Path) -> None:
    written = lines(trained_run / "metrics.jsonl")
    assert [r["step"] for r in written] == [1, 2]  # the earlier run's rows (steps 0 and 5, conftest) dropped
    curves = get(f"{served}/api/metrics?run=0")
    assert [r["step"] for r in curves["records"]] == [1, 2] and curves["skipped_lines"] == 0
    for mine, theirs in zip(curves["records"], written):
        for key in ("reward/mean", "actor/kl", "actor/entropy", "response_length/mean", "timing_s/rollout"):
            assert mine[key] == theirs[key], key
    # 2 prompts x 2 responses a step: the x axis "responses trained on" sums levels/responses (or the counts)
    assert [r["_samples"] for r in curves["records"]] == [4.0, 8.0]

    health = get(f"{served}/api/health?run=0")
    assert health["last_step"] == 2
    # trainer.save_every=0 saves only at the end: step 2's checkpoint, verified file by file against its manifest
    assert [(c["name"], c["step"], c["manifest"], c["ok"]) for c in health["checkpoints"]] == [
        ("step_000002", 2, True, True)]
    alarms = {a["name"]: a for a in health["alarms"]}
    assert "skipped optimizer steps" in alarms and alarms["skipped optimizer steps"]["level"] == "ok"

    logged = lines(trained_run / "samples.jsonl")
    assert logged and {r["step"] for r in logged} == {1, 2}
    page = get(f"{served}/api/samples?run=0&limit=200")
    assert page["rows_in_log"] == len(logged) and page["skipped_lines"] == 0
    assert [(r["step"], r["response"], r["reward"]) for r in page["rows"]] == [
        (r["step"], r["response"], r["reward"]) for r in logged]
    verdicts = Counter("failed" if r["failed"] else "correct" if r["correct"] else "wrong" for r in logged)
    assert page["facets"]["verdict"] == dict(sorted(verdicts.items()))
    step2 = get(f"{served}/api/samples?run=0&step=2")
    assert step2["total"] == sum(r["step"] == 2 for r in logged)
    first = page["rows"][0]
    same = get(f"{served}/api/prompt?run=0&key={first['prompt_key']}")
    assert same["prompt"] == first["prompt"]
    assert same["samples"] == sum(r["prompt"] == first["prompt"] for r in logged) >= 2  # a group's responses
    assert same["pair"] is not None and same["pair"]["a_row"]["response"] in {r["response"] for r in logged}
