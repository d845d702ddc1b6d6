"""The KL that bf16 arithmetic alone puts between the actor and the reference -> JSON.

On the GPU the actor trains fp32 shards and computes in bf16 (FSDP2's MixedPrecisionPolicy), and the reference
keeps bf16 shards (``ref.param_dtype=auto``). At step 1, before any update, the two forwards are the same and
``actor/kl`` is 0. After one update at lr 1e-6, the GSM8K run on an H100 logged ``actor/kl`` 0.0026, and it stayed
at 0.0026-0.0027 for 200 steps (``results/gsm8k_curve_metrics.jsonl``). Within a step the policy moved about 1e-4
(``actor/ppo_kl``), and on the CPU, in fp32, the same recipe kept the KL below 3e-5.

This script asks whether the floor is rounding. It takes the real SmolLM2-135M-Instruct and teacher-forces GSM8K
test questions with their reference answers. It moves the fp32 weights the way one small AdamW step does (every
weight by +-size, random signs, or only a random fraction of them). Then it measures the mean per-token
KL(perturbed || original), over full next-token distributions, twice: with both forwards in fp32 (the policy's own
movement) and with both models cast to bf16 and run in bf16 (what the trainer logs on a GPU). Everything runs on
this CPU, with torch's CPU bf16 kernels, not the GPU's; the GPU's floor can differ.

    python benchmarks/bf16_kl_floor.py --out benchmarks/results/bf16_kl_floor.json
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import torch

from reasonrl.bench.records import RESULTS, write

PERTURBATIONS = [(1e-6, 1.0), (1e-5, 1.0), (1e-6, 1e-4), (0.0, 1.0)]
"""(step size, fraction of weights moved): one AdamW step at lr 1e-6 and 1e-5 moves every weight by about lr; a
fraction of 1e-4 moves about 13,500 of SmolLM2's weights; size 0 is the control (the same weights)."""


def token_sequences(tokenizer, data_file: Path, count: int, max_tokens: int) -> List[torch.Tensor]:
    """Question + reference answer of the first ``count`` rows, as token ids (at most ``max_tokens`` each)."""
    rows = [json.loads(line) for line in data_file.read_text().splitlines()[:count]]
    return [tokenizer(r["question"] + "\n" + r["answer"], return_tensors="pt").input_ids[:, :max_tokens] for r in rows]


def next_token_log_probs(model, dtype: torch.dtype, seqs: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """Log-softmax over the vocabulary at every position, the model cast to ``dtype`` and run in it."""
    cast = copy.deepcopy(model).to(dtype).eval()
    with torch.no_grad():
        return [torch.log_softmax(cast(ids).logits.float()[0, :-1], -1) for ids in seqs]


def mean_kl(p: Sequence[torch.Tensor], q: Sequence[torch.Tensor]) -> float:
    """Mean over all positions of KL(p || q) = sum_v p_v (log p_v - log q_v)."""
    total = sum(float((lp.exp() * (lp - lq)).sum()) for lp, lq in zip(p, q))
    return total / sum(lp.shape[0] for lp in p)


def perturbed(model, size: float, fraction: float, seed: int):
    """A copy of ``model`` whose fp32 weights moved by +-``size`` (random signs) on a random ``fraction`` of them."""
    gen = torch.Generator().manual_seed(seed)
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            step = size * (torch.randint(0, 2, p.shape, generator=gen) * 2 - 1).to(p.dtype)
            if fraction < 1.0:
                step = step * (torch.rand(p.shape, generator=gen) < fraction)
            p.add_(step)
    return out


def changed_bf16_weights(a, b) -> Tuple[int, int]:
    """How many weights differ once both models are cast to bf16, and how many there are."""
    changed = sum(int((p.to(torch.bfloat16) != q.to(torch.bfloat16)).sum()) for p, q in zip(a.parameters(),
                                                                                           b.parameters()))
    return changed, sum(p.numel() for p in a.parameters())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path(os.environ.get("REASONRL_DATA_DIR", "../shared/data"))
                    / "gsm8k_test.jsonl", help="GSM8K test rows (question, answer)")
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "bf16_kl_floor.json")
    args = ap.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reasonrl.models.loader import convert_packaged_gguf

    start = time.time()
    path = convert_packaged_gguf()
    tokenizer = AutoTokenizer.from_pretrained(path)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    seqs = token_sequences(tokenizer, args.data, args.sequences, args.max_tokens)
    ref32, ref16 = next_token_log_probs(base, torch.float32, seqs), next_token_log_probs(base, torch.bfloat16, seqs)
    rows: List[Dict[str, Any]] = []
    for i, (size, fraction) in enumerate(PERTURBATIONS):
        moved = perturbed(base, size, fraction, args.seed + i)
        changed, total = changed_bf16_weights(moved, base)
        row = {"step_size": size, "fraction_moved": fraction,
               "kl_fp32": mean_kl(next_token_log_probs(moved, torch.float32, seqs), ref32),
               "kl_bf16": mean_kl(next_token_log_probs(moved, torch.bfloat16, seqs), ref16),
               "bf16_weights_changed": changed, "weights": total}
        rows.append(row)
        print(f"+-{size:g} on {fraction:g} of the weights: KL fp32 {row['kl_fp32']:.2e}, bf16 {row['kl_bf16']:.2e} "
              f"({changed} of {total} bf16 weights changed)", flush=True)
    result = {
        "benchmark": "bf16_kl_floor",
        "model": str(path), "sequences": args.sequences, "tokens": sum(s.shape[1] - 1 for s in seqs),
        "kl_bf16_vs_fp32_same_weights": mean_kl(ref16, ref32),
        "perturbations": rows,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                    "threads": torch.get_num_threads()},
        "wall_s": round(time.time() - start, 1),
        "notes": ["KL(perturbed || original), mean over positions of the full next-token distributions, teacher-forced "
                  "on GSM8K test questions with their reference answers",
                  "CPU bf16 kernels; the GPU's (cuBLAS, the varlen attention) round differently"],
    }
    print(f"the same weights, bf16 forward against fp32: KL {result['kl_bf16_vs_fp32_same_weights']:.2e}")
    write(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
