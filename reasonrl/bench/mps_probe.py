"""``benchmarks/gpu_mps_probe.sh``'s output as JSON: one record per timed client (what MPS's client priority and SM
limit do to a neighbour, issue #48), and for each limit on the trainer-like client measured both ways the two
clients' shares of their speed alone (``overlap_shares``). Standard library only: the probe runs on the bare GPU
image, before the carried parts are unpacked.

    python -m reasonrl.bench.mps_probe LOG OUT.json
"""
from __future__ import annotations

import json
import re
import sys
from typing import Any, Dict, Iterable, List

TIMED = re.compile(r"^(?P<label>.+?) (?P<count>\d+) (?P<what>matmuls|decode-like steps) s (?P<seconds>[\d.]+)"
                   r"(?: weight GB/s (?P<gb_s>\d+))?$")
"""A timed client's line: its label (the client's extra environment), how many kernels of which kind, its
seconds, and for the decode-like client the weight bytes it streamed per second."""


def probe_records(lines: Iterable[str]) -> Dict[str, Any]:
    """``probes``: each timed line by label; ``errors``: the lines that say a client failed (a traceback's last
    line, or a refused MPS client)."""
    probes: Dict[str, Dict[str, Any]] = {}
    errors: List[str] = []
    for line in (raw.rstrip("\n") for raw in lines):
        timed = TIMED.match(line)
        if timed:
            record: Dict[str, Any] = {"kernels": timed["what"], "count": int(timed["count"]),
                                      "seconds": float(timed["seconds"])}
            if timed["gb_s"] is not None:
                record["weight_gb_per_s"] = int(timed["gb_s"])
            probes[timed["label"]] = record
        elif "Error" in line:
            errors.append(line)
    return {"probes": probes, "errors": errors}


def overlap_shares(probes: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[str, float]]:
    """For each limit L (a label's part: ``normal``, ``low``, ``sm60``, ...) whose two lines are there, the compute
    (trainer-like) client's speed beside a busy decode-like client (``L_beside_busy_decode``) and the decode-like
    client's beside a busy compute client under L (``decode_beside_busy_L``), each as a share of its speed alone
    (``solo``, ``decode_solo``), and their sum: above 1 the two overlap better than taking turns would. A label is
    read by its last word, without the probe's ``A=`` (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60 A=sm60_beside_...``)."""
    seconds = {label.split()[-1].removeprefix("A="): record["seconds"] for label, record in probes.items()}
    if "solo" not in seconds or "decode_solo" not in seconds:
        return {}
    shares: Dict[str, Dict[str, float]] = {}
    for label in seconds:
        if not label.endswith("_beside_busy_decode"):
            continue
        limit = label[:-len("_beside_busy_decode")]
        decode = seconds.get(f"decode_beside_busy_{limit}")
        if decode is not None:
            compute_share, decode_share = seconds["solo"] / seconds[label], seconds["decode_solo"] / decode
            shares[limit] = {"compute": round(compute_share, 3), "decode": round(decode_share, 3),
                             "sum": round(compute_share + decode_share, 3)}
    return shares


def main(argv: List[str]) -> None:
    log, out = argv
    lines = open(log).read().splitlines()
    records = probe_records(lines)
    with open(out, "w") as f:
        json.dump({"benchmark": "gpu_mps_probe", **records, "overlap_shares": overlap_shares(records["probes"]),
                   "output": lines}, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
