"""``benchmarks/gpu_mps_probe.sh``'s output as JSON: one record per timed client (what MPS's client priority and SM
limit do to a neighbour, issue #48). Standard library only: the probe runs on the bare GPU image, before the carried
parts are unpacked.

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


def main(argv: List[str]) -> None:
    log, out = argv
    lines = open(log).read().splitlines()
    with open(out, "w") as f:
        json.dump({"benchmark": "gpu_mps_probe", **probe_records(lines), "output": lines}, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
