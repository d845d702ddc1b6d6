"""Wall time of scoring a step's responses through the remote reward endpoint against a loopback service that
takes a fixed time per request: the concurrency cap (``reward.remote.concurrency``) and the batch size
(``reward.remote.batch_size``) against that latency, and the router's overhead over the endpoint alone.

    python benchmarks/reward_endpoint.py [--items 64] [--latency-ms 50] [--out benchmarks/results/reward_endpoint.json]
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from reasonrl.config.reward_sources_schema import RemoteRewardConfig
from reasonrl.rewards import RewardItem
from reasonrl.rewards.remote import RemoteRewardSource


def serve(latency_s: float) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(latency_s)  # the service's own work (a model forward, say)
            body = json.dumps({"results": [{"score": 0.5} for _ in payload["items"]]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=64)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "reward_endpoint.json")
    args = parser.parse_args()
    server = serve(args.latency_ms / 1000)
    url = f"http://127.0.0.1:{server.server_address[1]}/score"
    row = {"data_source": "bench", "prompt": [{"role": "user", "content": "q"}]}
    items = [RewardItem(None, f"response {i}", "gold", {}, row=row, sources={"remote": 1.0})
             for i in range(args.items)]
    runs = []
    for batch_size in (1, 8):
        for concurrency in (1, 4, 16):
            source = RemoteRewardSource(RemoteRewardConfig(url=url, batch_size=batch_size, concurrency=concurrency),
                                        (0.0, 1.0))
            start = time.perf_counter()
            results = source.submit(items).result()
            seconds = time.perf_counter() - start
            source.close()
            assert not any(r.failed for r in results)
            requests = -(-args.items // batch_size)
            ideal = -(-requests // concurrency) * args.latency_ms / 1000
            runs.append({"batch_size": batch_size, "concurrency": concurrency, "requests": requests,
                         "seconds": round(seconds, 3), "ideal_s": ideal, "items_per_s": round(args.items / seconds, 1)})
            print(runs[-1], flush=True)
    server.shutdown()
    out = {"items": args.items, "latency_ms": args.latency_ms, "load_avg_1m": os.getloadavg()[0], "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
