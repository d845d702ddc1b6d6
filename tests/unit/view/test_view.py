"""``python -m reasonrl.view``: the JSON API over a run directory written with the trainer's own writers (RunLogger's
metrics.jsonl and sample log, save_checkpoint), the CLI's bad input, the export, and the page in a real headless
Chromium (slow)."""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
from chromium_cdp import Chromium, Tab
from view_serving import get_json as get, serving

from reasonrl.logging import make_logger
from reasonrl.logging.sample_log import sample_log_row
from reasonrl.trainer.checkpoint import drop_rows_after, save_checkpoint
from reasonrl.view.api import ApiError, metrics as metrics_api, samples as samples_api
from reasonrl.view.cli import main
from reasonrl.view.export import export_html
from reasonrl.view.runs import open_runs

STEPS = 30
RESPONSES_PER_STEP = 4


def step_metrics(step: int) -> Dict[str, float]:
    """A step's metrics, shaped like the trainer's (the keys it logs), with values that follow the step."""
    out = {"reward/mean": step / STEPS, "reward/accuracy": step / (2 * STEPS), "reward/math/accuracy": step / STEPS,
           "reward/code/accuracy": 0.5, "actor/kl": 0.001 * step * (1 + 0.3 * math.sin(step)),
           "actor/entropy": 1.0 - step / (2 * STEPS) + 0.05 * math.cos(2 * step),
           "response_length/mean": 100.0 + step + 8 * math.sin(step / 2), "timing_s/rollout": 10.0 + math.sin(step), "timing_s/update_actor": 5.0,
           "timing_s/step": 16.0, "perf/tokens_per_s": 500.0, "levels/responses": float(RESPONSES_PER_STEP),
           "reward/failed_count": 1.0 if step == 3 else 0.0, "actor/optimizer_steps": 2.0,
           "actor/skipped_optimizer_steps": 2.0 if step == 5 else 0.0,
           "weight_sync/logprob_diff_max": 0.01, "weight_sync/logprob_diff_mean": 0.001}
    if step == 3:
        out["reward/code/failed"] = 1.0
    return out


def samples_of(step: int) -> List[Dict[str, Any]]:
    """Step 3 logs four samples: correct math, wrong math, a failed code sample, a multi-turn math one; every other
    logged step two math samples."""
    math_row = {"data_source": "gsm8k", "reward_model": {"ground_truth": "42"}}
    code_row = {"data_source": "mbpp", "reward_model": {"ground_truth": {"tests": ["assert f() == 1"]}}}
    rows = [sample_log_row("What is 6*7?", "It is \\boxed{42}", 1.0, "math", False, "match", True, math_row, 7, "stop"),
            sample_log_row("What is 6*7?", "It is \\boxed{41}", 0.0, "math", False, "wrong answer", False, math_row,
                           7, "stop")]
    if step == 3:
        rows += [sample_log_row("Write f", "def f(): while True: pass", 0.0, "code", True,
                                "timeout after 5.0 s in the sandbox", None, code_row, 9, "stop",
                                weights_version=2, newest_version=3),  # a partial rollout's tokens span v2 and v3
                 sample_log_row("What is 6*7?", "<tool_call>6*7</tool_call>", 1.0, "math", False, "match", True,
                                math_row, 30, "stop",
                                conversation="[assistant]\n<tool_call>6*7</tool_call>\n[tool]\n42\n[assistant]\n"
                                             "\\boxed{42}")]
    return rows


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    """A run directory written by the trainer's writers: 30 steps of metrics, samples every step, two checkpoints
    (the second damaged), and one sample-log line of another shape."""
    run = tmp_path / "grpo_run"
    logger = make_logger(["jsonl"], str(run), {}, project="p", experiment="e")
    for step in range(1, STEPS + 1):
        logger.log(step_metrics(step), step)
        logger.log_samples(samples_of(step), step)
    logger.close()
    with open(run / "samples.jsonl", "a") as f:
        f.write(json.dumps(["an", "old", "row"]) + "\n")
    for step in (10, 20):
        save_checkpoint(str(run), step, lambda d: Path(d, "actor_optim.pt").write_bytes(b"x" * 64),
                        {"step": step, "sampler": {"epoch": 0, "offset": step}}, "trainer: {}\n")
    damaged = run / "checkpoints" / "step_000020" / "actor_optim.pt"
    damaged.write_bytes(b"y" * 64)
    return run


@pytest.fixture()
def served(run_dir: Path) -> Iterator[str]:
    with serving(open_runs([run_dir])) as url:
        yield url


def snapshot(path: Path) -> Dict[str, Any]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*"))}


def test_metrics_api_in_file_order_with_trained_samples(served: str, run_dir: Path) -> None:
    info = get(f"{served}/api/runs")
    assert [r["label"] for r in info["runs"]] == ["grpo_run"]
    got = get(f"{served}/api/metrics?run=0")
    assert [r["step"] for r in got["records"]] == list(range(1, STEPS + 1))
    assert got["records"][2]["reward/mean"] == pytest.approx(3 / 30)
    assert [r["_samples"] for r in got["records"][:3]] == [4.0, 8.0, 12.0]  # 4 responses a step, summed
    assert got["skipped_lines"] == 0 and got["truncated_tail"] == 0


def test_live_pickup_truncated_and_foreign_lines(served: str, run_dir: Path) -> None:
    first = get(f"{served}/api/metrics?run=0")
    cursor = f"since={first['next']}&generation={first['generation']}"
    logger = make_logger(["jsonl"], str(run_dir), {}, project="p", experiment="e")
    logger.log({"reward/mean": 0.99}, STEPS + 1)  # the trainer's writer appends a step
    new = get(f"{served}/api/metrics?run=0&{cursor}")
    assert not new["reset"] and [(r["step"], r["reward/mean"]) for r in new["records"]] == [(STEPS + 1, 0.99)]
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('"not an object"\n{"step": 32, "reward/me')  # a foreign line, then a line torn mid-write
    cursor = f"since={new['next']}&generation={new['generation']}"
    torn = get(f"{served}/api/metrics?run=0&{cursor}")
    assert torn["records"] == [] and torn["skipped_lines"] == 1 and torn["truncated_tail"] == 1
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('an": 0.5}\n')  # the rest of the line arrives
    done = get(f"{served}/api/metrics?run=0&{cursor}")
    assert [(r["step"], r["reward/mean"]) for r in done["records"]] == [(32, 0.5)] and done["truncated_tail"] == 0
    logger.close()


def test_resume_cut_rereads_the_file(run_dir: Path) -> None:
    runs = open_runs([run_dir])
    first = metrics_api(runs, {})
    drop_rows_after(run_dir / "metrics.jsonl", 10)  # what a resume from step 10 does to the file
    again = metrics_api(runs, {"since": str(first["next"]), "generation": str(first["generation"])})
    assert again["reset"] and [r["step"] for r in again["records"]] == list(range(1, 11))


def test_sample_filters_and_pages(served: str) -> None:
    everything = get(f"{served}/api/samples?run=0&limit=200")
    assert everything["rows_in_log"] == 2 * STEPS + 2 and everything["total"] == 2 * STEPS + 2
    assert everything["skipped_lines"] == 1  # the row of another shape
    assert everything["facets"]["verdict"] == {"correct": STEPS + 1, "failed": 1, "wrong": STEPS}
    failed = get(f"{served}/api/samples?run=0&verdict=failed")
    assert failed["total"] == 1
    row = failed["rows"][0]
    assert (row["step"], row["verifier"], row["data_source"]) == (3, "code", "mbpp")
    assert row["reason"] == "timeout after 5.0 s in the sandbox" and row["ground_truth"] == {"tests": ["assert f() == 1"]}
    assert (row["weights_version"], row["newest_version"]) == (2, 3)
    assert "weights_version" not in everything["rows"][0]  # a colocated row records no version
    assert get(f"{served}/api/samples?run=0&data_source=mbpp")["total"] == 1
    assert get(f"{served}/api/samples?run=0&verifier=math&step=3")["total"] == 3
    assert get(f"{served}/api/samples?run=0&step_min=29&step_max=30")["total"] == 4
    assert get(f"{served}/api/samples?run=0&reward_min=0.5&verdict=wrong")["total"] == 0
    assert get(f"{served}/api/samples?run=0&len_min=8")["total"] == 2  # the code sample (9) and the tool one (30)
    assert get(f"{served}/api/samples?run=0&reason=TIMEOUT")["total"] == 1
    assert get(f"{served}/api/samples?run=0&data_source=nowhere")["total"] == 0
    tool = get(f"{served}/api/samples?run=0&len_min=30")["rows"][0]
    assert "[tool]\n42" in tool["conversation"]
    page1 = get(f"{served}/api/samples?run=0&verdict=wrong&limit=4")
    page2 = get(f"{served}/api/samples?run=0&verdict=wrong&limit=4&offset=4")
    assert [r["step"] for r in page1["rows"]] == [1, 2, 3, 4] and [r["step"] for r in page2["rows"]] == [5, 6, 7, 8]
    with pytest.raises(urllib.error.HTTPError) as bad:
        get(f"{served}/api/samples?run=0&reward_min=lots")
    assert bad.value.code == 400 and "reward_min" in json.loads(bad.value.read())["error"]


def test_new_samples_picked_up(run_dir: Path) -> None:
    runs = open_runs([run_dir])
    assert samples_api(runs, {"step": str(STEPS + 1)})["total"] == 0
    logger = make_logger(["jsonl"], str(run_dir), {}, project="p", experiment="e")
    logger.log_samples(samples_of(1), STEPS + 1)
    logger.close()
    assert samples_api(runs, {"step": str(STEPS + 1)})["total"] == 2
    with pytest.raises(ApiError):
        samples_api(runs, {"run": "7"})


def test_health_alarms_and_checkpoints(served: str, run_dir: Path) -> None:
    before = snapshot(run_dir)
    health = get(f"{served}/api/health?run=0")
    alarms = {a["name"]: a for a in health["alarms"]}
    assert (alarms["failed rewards (all verifiers)"]["figure"], alarms["failed rewards (all verifiers)"]["step"]) == ("1", 3)
    code = alarms["failed rewards: code"]
    assert code["level"] == "alarm" and "timeout after 5.0 s in the sandbox x1" in code["detail"]
    skipped = alarms["skipped optimizer steps"]
    assert (skipped["level"], skipped["figure"], skipped["step"]) == ("alarm", "2", 5)
    assert alarms["weight-sync check (max |engine - actor| log-prob)"]["level"] == "ok"
    assert alarms["unreadable lines in samples.jsonl"]["figure"] == "1"
    ckpts = {c["name"]: c for c in health["checkpoints"]}
    assert ckpts["step_000010"]["ok"] and not ckpts["step_000020"]["ok"]
    assert "actor_optim.pt" in ckpts["step_000020"]["error"] and "checksum" in ckpts["step_000020"]["error"]
    for path in ("/api/samples?run=0&verdict=failed", "/api/metrics?run=0", "/"):
        urllib.request.urlopen(served + path, timeout=30).read()
    assert snapshot(run_dir) == before  # the viewer never writes to the run directory


def test_bad_run_dirs_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(tmp_path / "missing")]) == 2
    assert "missing: not a directory" in capsys.readouterr().err
    assert main([""]) == 2 and "an empty path" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    proc = subprocess.run([sys.executable, "-m", "reasonrl.view", str(tmp_path / "empty")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "empty: not a run directory" in proc.stderr and "metrics.jsonl" in proc.stderr


def test_export_is_self_contained(run_dir: Path, tmp_path: Path) -> None:
    out = export_html(open_runs([run_dir]), tmp_path / "run.html")
    html = out.read_text()
    assert "/static/" not in html and "<script src" not in html and "<link" not in html
    assert set(re.findall(r"https?://[^\s\"']+", html)) == {"http://www.w3.org/2000/svg"}  # a name, not a load
    assert "window.VIEW_DATA" in html and "timeout after 5.0 s in the sandbox" in html


# ---------------------------------------------------------------------- the page in a real browser
@contextlib.contextmanager
def tab_at(browser: Chromium, url: str, failure_png: Path, size=(1280, 1200)) -> Iterator[Tab]:
    """A tab of the session's Chromium at ``url`` once the page has its data (``data-ready``); a screenshot of it
    when the test fails in it."""
    tab = browser.open(url, size)
    try:
        tab.wait_ready()
        yield tab
    except BaseException:
        tab.screenshot(failure_png)
        print(f"screenshot: {failure_png}")
        raise
    finally:
        tab.close()


@pytest.fixture()
def served_two(run_dir: Path, tmp_path: Path) -> Iterator[str]:
    """The run and a shorter copy of it (its metrics cut after step 10), served together."""
    other = tmp_path / "other_run"
    shutil.copytree(run_dir, other)
    drop_rows_after(other / "metrics.jsonl", 10)
    with serving(open_runs([run_dir, other])) as url:
        yield url


@pytest.mark.slow
def test_page_in_chromium(served_two: str, chromium_browser: Chromium, tmp_path: Path) -> None:
    served = served_two
    with tab_at(chromium_browser, f"{served}/?verdict=failed&x=samples", tmp_path / "failed.png") as tab:
        page = tab.html()
    assert 'data-ready="1"' in page
    assert page.count('class="series"') >= 20  # curves drawn as SVG paths (reward, accuracy, KL, ...) for 2 runs
    assert 'id="chart-reward"' in page and 'id="chart-timing"' in page and "responses trained on" in page
    assert 'data-run="1"' in page and "other_run · reward/mean = 0.333" in page  # the second run overlaid: 10/30
    assert page.count('<article class="sample') == 1 and "timeout after 5.0 s in the sandbox" in page
    assert "weights v2\u2013v3" in page  # the failed sample's weight versions on its card
    with tab_at(chromium_browser, f"{served}/run/0", tmp_path / "failed.png") as tab:
        unfiltered = tab.html()
    assert unfiltered.count('<article class="sample') == 20  # one page of the 62 rows
    assert "damaged" in unfiltered and "verifies" in unfiltered
    # docs/view.png is made this way: REASONRL_VIEW_PNG=docs/view.png
    with tab_at(chromium_browser, f"{served}/?smooth=3", tmp_path / "failed.png", size=(1320, 1500)) as tab:
        png = tab.screenshot(tmp_path / "view.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("REASONRL_VIEW_PNG"):
        shutil.copy(png, os.environ["REASONRL_VIEW_PNG"])


@pytest.mark.slow
def test_export_in_chromium(run_dir: Path, chromium_browser: Chromium, tmp_path: Path) -> None:
    out = export_html(open_runs([run_dir]), tmp_path / "run.html")
    with tab_at(chromium_browser, out.as_uri() + "?verdict=failed", tmp_path / "failed.png") as tab:
        page = tab.html()
    assert page.count('class="series"') >= 10 and page.count('<article class="sample') == 1
    assert "timeout after 5.0 s in the sandbox" in page


def test_no_torch_or_ray_at_import() -> None:
    """The viewer starts fast and lean: torch comes in only to verify checkpoints (docs/architecture.md)."""
    code = ("import sys, reasonrl.view.cli, reasonrl.view.server, reasonrl.view.export; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr
