"""Seconds of a no-grad log-prob pass over a long-tailed batch with the real SmolLM2 on this CPU: padded micro-batches
of fixed rows, padded by token budget (trimmed), packed by token budget -> JSON.

    python benchmarks/packing_cpu.py [--rows 16] [--prompt-len 64] [--median 96] [--max-len 384] [--budget 2048]
                                     [--attn sdpa] [--out results/packing_cpu.json]

The batch: ``--rows`` random-token prompts of ``--prompt-len`` and responses with lengths from
``reasonrl.bench.lengths.response_lengths("longtail", ...)``. Each layout runs ``--repeats`` times (best kept); the log-probs of
every layout are checked against the padded ones (max abs difference in the JSON).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402

from reasonrl.bench.lengths import response_lengths  # noqa: E402
from reasonrl.data.collate import collate_rollout  # noqa: E402
from reasonrl.data.micro_batches import micro_batch_groups, restore_order  # noqa: E402
from reasonrl.models import load_causal_lm, resolve_model_path  # noqa: E402
from reasonrl.models.forward import micro_batch_log_probs  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def run_pass(model, batch, rows_per_group: int, budget: int, packed: bool):
    groups = micro_batch_groups(batch["attention_mask"], batch["responses"].shape[1], rows_per_group, budget, packed)
    start = time.perf_counter()
    with torch.no_grad():
        parts = [micro_batch_log_probs(model, *(batch.select(g)[k] for k in ("input_ids", "attention_mask",
                                                                             "position_ids", "responses")),
                                       packed=packed)[0] for g in groups]
    return time.perf_counter() - start, restore_order(parts, groups), len(groups)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--median", type=int, default=96)
    p.add_argument("--max-len", type=int, default=384)
    p.add_argument("--micro-batch", type=int, default=8, help="rows per micro-batch of the fixed layout")
    p.add_argument("--budget", type=int, default=2048, help="tokens per micro-batch of the budget layouts")
    p.add_argument("--attn", default="sdpa")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "packing_cpu.json")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model = load_causal_lm(resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct"), torch.float32,
                           attn=args.attn).eval()
    rng = random.Random(0)
    lengths = response_lengths("longtail", args.rows, args.max_len, args.median, seed=0)
    prompts = [[rng.randrange(10, 40000) for _ in range(args.prompt_len)] for _ in range(args.rows)]
    responses = [[rng.randrange(10, 40000) for _ in range(n)] for n in lengths]
    batch = collate_rollout(prompts, responses, [[0.0] * n for n in lengths], pad_id=0)
    layouts = {"padded_fixed_rows": (args.micro_batch, 0, False), "padded_token_budget": (args.micro_batch,
                                                                                         args.budget, False),
               "packed_token_budget": (args.micro_batch, args.budget, True),
               "packed_fixed_rows": (args.micro_batch, 0, True)}
    result = {"benchmark": "packing_cpu", "args": {k: str(v) for k, v in vars(args).items()},
              "machine": {"platform": platform.platform(), "torch": torch.__version__, "cpus": os.cpu_count(),
                          "threads": torch.get_num_threads(), "load_avg": os.getloadavg()},
              "response_lengths": {"sum": sum(lengths), "max": max(lengths), "median": sorted(lengths)[len(lengths) // 2]},
              "valid_tokens": int(batch["attention_mask"].sum()), "padded_tokens": int(batch["attention_mask"].numel()),
              "layouts": {}}
    reference = None
    for name, (rows, budget, packed) in layouts.items():
        best, out, count = None, None, 0
        for _ in range(args.repeats):
            seconds, out, count = run_pass(model, batch, rows, budget, packed)
            best = seconds if best is None else min(best, seconds)
        if reference is None:
            reference = out
        mask = batch["response_mask"].bool()
        result["layouts"][name] = {"seconds": best, "micro_batches": count,
                                   "max_abs_diff_vs_padded": float((out - reference)[mask].abs().max())}
        print(name, result["layouts"][name], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
