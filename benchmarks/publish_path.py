"""How a fleet's weights reach a replica through Ray: the seconds from actor rank 0's tensors to tensors in the
replica's hands, for the path the fleet takes (``reasonrl.workers.published_weights``: the actor packs the tensors as
byte arrays and puts them itself; the replica maps them) against the path it took before (the actor returned the
tensors, the driver put them, the replica unpickled them) -> JSON.

    python benchmarks/publish_path.py                          # SmolLM2-135M's fp32 weights and 1 GiB of bf16
    python benchmarks/publish_path.py --gib 3 --repeats 3 --out /tmp/publish_path.json

Both paths run in the same Ray session with the same two actors (an "actor" holding the tensors, a "replica" taking
them), ``--repeats`` times each, alternating; the figures are the median and the spread of the repeats. The replica
touches every tensor (sums its element count) but does not copy it; an engine's load (a device copy) comes after
either path and is not timed here. On a GPU the gather's device-to-host copy comes before either path, also not
timed.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import torch

from reasonrl.bench.records import RESULTS, write
from reasonrl.workers.published_weights import put, unpack


def synthetic(gib: float, tensors: int = 338) -> List:
    """``gib`` GiB of bf16 in ``tensors`` equal tensors (338: Qwen2.5-1.5B's parameter count)."""
    n = int(gib * 2 ** 30 / 2 / tensors)
    return [(f"layer{i}.weight", torch.randn(n).to(torch.bfloat16)) for i in range(tensors)]


def smollm2(model_path: str) -> List:
    from transformers import AutoModelForCausalLM

    from reasonrl.models import resolve_model_path

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(model_path), dtype=torch.float32)
    return [(name, p.detach().clone()) for name, p in model.named_parameters()]


def measure(weights: Dict[str, Any], repeats: int) -> Dict[str, Any]:
    import ray

    @ray.remote
    class Holder:
        def __init__(self, named):
            self.named = named

        def as_tensors(self):  # the path before: the tensors returned (pickled one by one)
            return [(n, t.detach().to("cpu", copy=True)) for n, t in self.named]

        def as_published(self):  # the path now: packed and put by the actor itself, as gather_weights does
            return put(self.named)

    @ray.remote
    class Replica:
        def take_tensors(self, named):
            return sum(t.numel() for _, t in named)

        def take_published(self, published):
            return sum(t.numel() for _, t in unpack(published))

    out: Dict[str, Any] = {}
    for label, named in weights.items():
        holder, replica = Holder.remote(named), Replica.remote()
        ray.get([holder.__ray_ready__.remote(), replica.__ray_ready__.remote()])
        del named
        before: List[float] = []
        now: List[float] = []
        for _ in range(repeats):
            start = time.perf_counter()
            ref = ray.put(ray.get(holder.as_tensors.remote()))  # through the driver, as Replicas.put_weights did
            elements = ray.get(replica.take_tensors.remote(ref))
            before.append(time.perf_counter() - start)
            del ref
            start = time.perf_counter()
            got = ray.get(holder.as_published.remote())
            assert ray.get(replica.take_published.remote(got["ref"][0])) == elements
            now.append(time.perf_counter() - start)
            nbytes = got["bytes"]
            del got
        out[label] = {"bytes": nbytes, "elements": elements,
                      "tensors_via_driver_s": spread(before), "published_s": spread(now),
                      "speedup_median": statistics.median(before) / statistics.median(now)}
        print(f"{label}: {nbytes / 2 ** 30:.2f} GiB, before {statistics.median(before):.2f} s, now "
              f"{statistics.median(now):.2f} s", flush=True)
        ray.kill(holder)
        ray.kill(replica)
    return out


def spread(values: List[float]) -> Dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gib", type=float, default=1.0, help="synthetic bf16 weights, GiB (0: none)")
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct",
                   help="a model whose fp32 weights are measured too (reasonrl.models.resolve_model_path; '': none)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS / "publish_path.json")
    args = p.parse_args(argv)
    import ray

    weights: Dict[str, Any] = {}
    if args.model:
        weights[f"fp32 {args.model.split('/')[-1]}"] = smollm2(args.model)
    if args.gib > 0:
        weights[f"bf16 synthetic {args.gib:g} GiB"] = synthetic(args.gib)
    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="publish-path",
             object_store_memory=int(max(2.0, 3 * args.gib) * 2 ** 30))
    try:
        result = {"benchmark": "publish_path", "args": vars(args) | {"out": str(args.out)},
                  "machine": {"platform": platform.platform(), "python": sys.version.split()[0],
                              "torch": torch.__version__, "cpus": os.cpu_count(),
                              "load_avg": os.getloadavg()},
                  "results": measure(weights, args.repeats)}
    finally:
        ray.shutdown()
    write(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
