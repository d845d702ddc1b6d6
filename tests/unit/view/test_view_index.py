"""The run viewer's sample index on a large log: the first request answers while the index is built in the
background (ordered by the indexer's ``after_batch`` hook, not by time), pages over the rows indexed so far, and the
counts are exact once it is done; categorical filters page from their position arrays at any depth; every filter
against a brute-force reading of the log (steps in order and not)."""
from __future__ import annotations

import itertools
import json
import random
import threading
from pathlib import Path
from typing import Any, Dict, List

import pytest
from view_serving import get_json as get, serving

from reasonrl.view.runs import open_runs
from reasonrl.view.sample_index import BATCH_LINES, SampleIndex
from reasonrl.view.sample_query import SampleQuery, Slices

ROWS = 200_000


def large_row(i: int) -> Dict[str, Any]:
    """Row i: step i // 100 + 1; verdict by i % 10 (0-5 correct, 6-8 wrong, 9 failed); verifier code when i % 4 == 0
    else math; data source by i % 3; length i % 50."""
    kind = i % 10
    failed, correct = kind == 9, kind < 6
    return {"step": i // 100 + 1, "prompt": f"p{i // 8}", "response": f"r{i}", "reward": 1.0 if correct else 0.0,
            "verifier": "code" if i % 4 == 0 else "math", "failed": failed, "correct": None if failed else correct,
            "reason": "timeout" if failed else "match", "data_source": ("a", "b", "c")[i % 3],
            "response_tokens": i % 50}


@pytest.fixture(scope="module")
def large_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("large") / "run"
    run.mkdir()
    with open(run / "samples.jsonl", "w") as f:
        f.writelines(json.dumps(large_row(i), separators=(",", ":")) + "\n" for i in range(ROWS))
    return run


def test_first_request_answers_while_indexing_and_counts_end_exact(large_run: Path) -> None:
    runs = open_runs([large_run])
    index = runs[0].samples
    first_batch, release = threading.Event(), threading.Event()

    def hold_after_first_batch(done: int, total: int) -> None:
        if not first_batch.is_set():
            first_batch.set()
            assert release.wait(120)

    index.after_batch = hold_after_first_batch
    with serving(runs) as url:
        base = f"{url}/api/samples?run=0"
        first = get(base)  # the indexer cannot finish before `release` is set: this answered first
        assert first["indexing"]["building"] and first["rows_in_log"] < ROWS
        assert first_batch.wait(120)
        partial = get(base + "&verdict=failed&limit=5")  # pages over the first batch
        assert partial["indexing"] == {"building": True, "lines_done": BATCH_LINES, "lines_total": ROWS}
        assert BATCH_LINES == 4096 and partial["rows_in_log"] == 4096
        assert partial["total"] == 409  # rows 9, 19, .., 4089
        assert [r["response"] for r in partial["rows"]] == ["r9", "r19", "r29", "r39", "r49"]
        release.set()
        assert index.idle.wait(300)
        done = get(base + "&limit=1")
        assert done["indexing"] == {"building": False, "lines_done": ROWS, "lines_total": ROWS}
        assert done["rows_in_log"] == ROWS and done["total"] == ROWS
        assert done["facets"]["verdict"] == {"correct": 120_000, "failed": 20_000, "wrong": 60_000}
        assert done["facets"]["verifier"] == {"code": 50_000, "math": 150_000}
        # wrong (i % 10 in 6..8) and code (i % 4 == 0): i % 20 in {8, 16}, 2 of every 20 rows
        assert get(base + "&verdict=wrong&verifier=code")["total"] == 20_000
        # failed rows are odd, code rows even
        assert get(base + "&verdict=failed&verifier=code")["total"] == 0
        # steps 11..20 are rows 1000..1999, of which i % 10 == 9: 100; of those data source a (i % 3 == 0): 33
        # (i = 1009 + 10k, i % 3 == 0 when k % 3 == 2: k = 2, 5, .., 98)
        assert get(base + "&step_min=11&step_max=20&verdict=failed")["total"] == 100
        assert get(base + "&step_min=11&step_max=20&verdict=failed&data_source=a")["total"] == 33
        # the k-th wrong row (k from 0) is row 10 * (k // 3) + 6 + k % 3, at any depth of the union of 6 groups
        deep = get(base + "&verdict=wrong&offset=54321&limit=4")
        assert [r["response"] for r in deep["rows"]] == [f"r{10 * (k // 3) + 6 + k % 3}" for k in range(54321, 54325)]
        # reason and length filters: timeout rows with length >= 45 (i % 50 in 45..49 and i % 10 == 9: i % 50 == 49)
        scanned = get(base + "&reason=TIME&len_min=45&offset=3&limit=2")
        assert scanned["total"] == ROWS // 50 and [r["response"] for r in scanned["rows"]] == ["r199", "r249"]


def brute_force(rows: List[Dict[str, Any]], params: Dict[str, str]) -> List[int]:
    """The positions of ``rows`` passing the filters, read the plain way."""
    def verdict(r):
        return "failed" if r["failed"] else ("correct" if r["correct"] else "wrong")

    out = []
    for i, r in enumerate(rows):
        lo = params.get("step", params.get("step_min"))
        hi = params.get("step", params.get("step_max"))
        checks = [lo is None or r["step"] >= float(lo), hi is None or r["step"] <= float(hi),
                  "verdict" not in params or verdict(r) == params["verdict"],
                  "verifier" not in params or r["verifier"] == params["verifier"],
                  "data_source" not in params or r["data_source"] == params["data_source"],
                  "reason" not in params or params["reason"].lower() in r["reason"].lower(),
                  "len_min" not in params or r["response_tokens"] >= float(params["len_min"]),
                  "reward_max" not in params or r["reward"] <= float(params["reward_max"])]
        if all(checks):
            out.append(i)
    return out


@pytest.mark.parametrize("steps_in_order", [True, False])
def test_every_filter_matches_a_brute_force_reading(tmp_path: Path, steps_in_order: bool) -> None:
    rng = random.Random(7)
    rows = [large_row(i) for i in range(3000)]
    if not steps_in_order:  # a log whose steps go back (no binary search on steps: the scan)
        for r in rows:
            r["step"] = rng.randint(1, 40)
    rows[17]["reason"] = "TimeOut in sandbox"
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    query = SampleQuery(SampleIndex(tmp_path))
    choices = {"verdict": ["correct", "wrong", "failed"], "verifier": ["math", "code"], "data_source": ["a", "c"],
               "step": ["12"], "step_min": ["5"], "step_max": ["20"], "reason": ["timeout"], "len_min": ["40"],
               "reward_max": ["0.5"]}
    for size in (0, 1, 2, 3):
        for keys in itertools.combinations(sorted(choices), size):
            params = {k: rng.choice(choices[k]) for k in keys}
            expected = brute_force(rows, params)
            offset = rng.randint(0, max(0, len(expected) - 1))
            for _ in range(2):  # the second time from the kept scan
                got = query.query({**params, "offset": str(offset), "limit": "7"})
                assert got["total"] == len(expected), params
                assert [r["position"] for r in got["rows"]] == expected[offset:offset + 7], params


def test_slices_page_is_the_union_in_order() -> None:
    a, b, c = [0, 4, 9, 12], [1, 2, 10], [3, 5, 6, 7, 20]
    union = Slices([(a, 1, 4), (b, 0, 3), (c, 1, 4)])  # 4 9 12 | 1 2 10 | 5 6 7
    assert len(union) == 9
    assert union.page(0, 3) == [1, 2, 4] and union.page(3, 4) == [5, 6, 7, 9] and union.page(7, 5) == [10, 12]
    assert union.page(9, 1) == [] and union.since(7) == [7, 9, 10, 12]


def test_rows_appended_after_a_scan_extend_it(tmp_path: Path) -> None:
    log = tmp_path / "samples.jsonl"
    log.write_text("".join(json.dumps(large_row(i)) + "\n" for i in range(100)))
    query = SampleQuery(SampleIndex(tmp_path))
    assert query.query({"reason": "time"})["total"] == 10  # rows 9, 19, .., 99
    with open(log, "a") as f:
        f.write("".join(json.dumps(large_row(i)) + "\n" for i in range(100, 130)))
    got = query.query({"reason": "time", "offset": "9"})
    assert got["total"] == 13 and [r["response"] for r in got["rows"]] == ["r99", "r109", "r119", "r129"]
