"""The run viewer on a large sample log -> benchmarks/results/view_index.json.

    python benchmarks/view_index.py [--rows 1000000] [--keep DIR]

Writes a sample log of ``--rows`` rows with the trainer's own row builder (``sample_log_row``: a 200-character
prompt, a 600-character response, 8 responses per prompt, 3 verdicts, 2 verifiers, 3 data sources), serves it with
``python -m reasonrl.view``'s server on loopback, and measures over HTTP: the first ``/api/samples`` request (it
answers while the index is built in the background), the time until the index is complete, and then pages: the
first and a deep one unfiltered, by one categorical filter, by two, by a step range, and a reason filter (first
request: the scan; second: a page of its kept matches). Also the index's size in memory (its arrays).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from reasonrl.logging.sample_log import SAMPLE_LOG, sample_log_row
from reasonrl.view.runs import open_runs
from reasonrl.view.server import make_server

RESULTS = Path(__file__).resolve().parent / "results"


def write_log(path: Path, rows: int) -> None:
    sources = ({"data_source": "gsm8k", "reward_model": {"ground_truth": "42"}},
               {"data_source": "math", "reward_model": {"ground_truth": "\\frac{1}{2}"}},
               {"data_source": "mbpp", "reward_model": {"ground_truth": {"tests": ["assert f() == 1"]}}})
    with open(path, "w") as f:
        for i in range(rows):
            prompt_id = i // 8
            prompt = f"Problem {prompt_id}: " + "what is the sum of the numbers below? " * 5
            response = f"Step {i}: " + "we add the first two numbers and carry the rest. " * 12
            kind = i % 10
            failed, correct = kind == 9, kind < 6
            row = sample_log_row(prompt, response, 1.0 if correct else 0.0, "code" if i % 4 == 0 else "math", failed,
                                 "timeout after 5.0 s" if failed else ("match" if correct else "wrong answer"),
                                 None if failed else correct, sources[i % 3], 100 + i % 400, "stop")
            f.write(json.dumps({**row, "step": 1 + prompt_id // 64}) + "\n")


def timed_get(url: str):
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as response:
        body = json.loads(response.read())
    return time.perf_counter() - start, body


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keep", default=None, help="write the log here (default: a temporary folder)")
    args = parser.parse_args()
    folder = Path(args.keep or tempfile.mkdtemp(prefix="view_index_"))
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / SAMPLE_LOG
    start = time.perf_counter()
    if not log.exists():
        write_log(log, args.rows)
    write_s = time.perf_counter() - start
    runs = open_runs([folder])
    server = make_server(runs, port=0)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/api/samples?run=0"
    index = runs[0].samples
    try:
        start = time.perf_counter()
        first_s, first = timed_get(base)
        index.idle.wait()
        built_s = time.perf_counter() - start
        pages = {}
        for name, query in (("unfiltered", ""), ("unfiltered_deep", "&offset=900000"),
                            ("verdict_failed", "&verdict=failed"),
                            ("verdict_wrong_deep", "&verdict=wrong&offset=200000"),
                            ("verdict_and_verifier", "&verdict=wrong&verifier=code"),
                            ("step_range", "&step_min=100&step_max=120&verdict=correct"),
                            ("reason_first", "&reason=timeout"), ("reason_next_page", "&reason=timeout&offset=20"),
                            ("reward_and_length", "&reward_min=0.5&len_min=450")):
            seconds, body = timed_get(base + query)
            pages[name] = {"seconds": round(seconds, 4), "total": body["total"], "rows": len(body["rows"])}
        with index.lock:
            arrays = [index.offsets, index.steps, index.lengths, index.rewards, index.prompt_keys,
                      *index.columns.values(), *index.groups.values()]
            index_bytes = sum(a.itemsize * len(a) for a in arrays)
            rows = len(index)
    finally:
        server.shutdown()
        server.server_close()
    result = {
        "rows": rows, "log_bytes": log.stat().st_size, "write_log_s": round(write_s, 1),
        "first_response_s": round(first_s, 4), "first_response_rows_indexed": first["rows_in_log"],
        "first_response_indexing": first["indexing"], "index_complete_s": round(built_s, 1),
        "index_array_bytes": index_bytes, "index_bytes_per_row": round(index_bytes / max(rows, 1), 1),
        "pages_after_build": pages,
        "machine": {"cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
                    "python": platform.python_version()},
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "view_index.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
