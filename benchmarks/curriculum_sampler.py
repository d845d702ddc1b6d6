"""What the curriculum samplers do to the share of zero-gradient groups, on simulated verifiers; and their cost.

No model and no learning: each prompt has a fixed true pass rate q_i (drawn once from Beta(--beta-a, --beta-b), a
U-shaped spread like a small model's on a mixed dataset: many prompts it never or always solves), each of the
``--n`` responses of a drawn prompt passes with probability q_i, and the sampler's PromptStats are updated from
those verdicts as the trainer will. Per sampler it reports the share of groups in a batch that are *informative*
(their responses neither all pass nor all fail, the only ones that give GRPO a gradient), over all steps, the first
epoch's worth of steps and the last. Uniform's expected share is mean_i(1 - q_i^n - (1 - q_i)^n), printed as a check.
Also the seconds per ``next_indices`` of each sampler and the size of ``PromptStats.state_dict()`` as JSON.

    python benchmarks/curriculum_sampler.py --out benchmarks/results/curriculum_sampler.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from typing import Dict, List

import numpy as np

from reasonrl.data import EpochSampler, MixtureSampler, PassRateSampler, PromptStats, curriculum_metrics, \
    pass_rate_band


def simulate(sampler_name: str, q: np.ndarray, args, seeded: bool = False) -> Dict[str, float]:
    """Run ``args.steps`` steps of one sampler; the informative share per step and the curriculum metrics."""
    rng = np.random.default_rng(args.seed + 1)  # the simulated verifiers (the same stream for every sampler)
    stats = PromptStats(len(q), (1.0, 1.0))
    if seeded:  # an evaluation of every prompt with n samples before training (data.pass_rate_file)
        verdicts = rng.random((len(q), args.n)) < q[:, None]
        stats.update(list(range(len(q))), verdicts.tolist(), 0)
    if sampler_name == "uniform":
        sampler = EpochSampler(len(q), args.batch, args.seed)
    else:
        sampler = PassRateSampler(stats, args.batch, args.seed, floor=args.floor)
    shares: List[float] = []
    for step in range(1, args.steps + 1):
        batch = sampler.next_indices()
        verdicts = rng.random((len(batch), args.n)) < q[batch][:, None]
        passes = verdicts.sum(axis=1)
        shares.append(float(((passes > 0) & (passes < args.n)).mean()))
        stats.update(batch, verdicts.tolist(), step)
    epoch_steps = max(1, len(q) // args.batch)
    final = curriculum_metrics(stats, sampler)
    return {"informative_share_mean": float(np.mean(shares)),
            "informative_share_first_epoch": float(np.mean(shares[:epoch_steps])),
            "informative_share_last_epoch": float(np.mean(shares[-epoch_steps:])),
            "final_metrics": {k: round(v, 4) for k, v in final.items()}}


def draw_seconds(make, draws: int = 20) -> float:
    sampler = make()
    sampler.next_indices()
    t0 = time.perf_counter()
    for _ in range(draws):
        sampler.next_indices()
    return (time.perf_counter() - t0) / draws


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--floor", type=float, default=0.02)
    ap.add_argument("--beta-a", type=float, default=0.4)
    ap.add_argument("--beta-b", type=float, default=0.6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    q = np.random.default_rng(args.seed).beta(args.beta_a, args.beta_b, args.prompts)
    expected_uniform = float(np.mean(1 - q ** args.n - (1 - q) ** args.n))
    runs = {"uniform": simulate("uniform", q, args),
            "pass_rate": simulate("pass_rate", q, args),
            "pass_rate_seeded_from_eval": simulate("pass_rate", q, args, seeded=True)}
    # The band filter on an n-sample evaluation: what it keeps, and the informative share of uniform over the kept.
    evaluation = PromptStats(len(q))
    verdicts = np.random.default_rng(args.seed + 2).random((len(q), args.n)) < q[:, None]
    evaluation.update(list(range(len(q))), verdicts.tolist(), 0)
    kept = pass_rate_band(evaluation, [0.1, 0.9])
    band = {"band": [0.1, 0.9], "kept_share": len(kept) / len(q),
            "expected_uniform_informative_share_over_kept":
                float(np.mean(1 - q[kept] ** args.n - (1 - q[kept]) ** args.n))}

    cost = {}
    for size, batch in ((7473, 256), (100_000, 512)):
        stats = PromptStats(size)
        stats.update(list(range(size)), [[True, False]] * size, 1)
        sources = ["a" if i % 3 else "b" for i in range(size)]
        cost[f"N={size},B={batch}"] = {
            "uniform_s": draw_seconds(lambda: EpochSampler(size, batch, 0)),
            "pass_rate_s": draw_seconds(lambda: PassRateSampler(stats, batch, 0)),
            "mixture_s": draw_seconds(lambda: MixtureSampler(sources, batch, 0, {"a": 1, "b": 1})),
            "stats_state_json_bytes": len(json.dumps(stats.state_dict())),
        }
    result = {"args": vars(args), "expected_uniform_informative_share": expected_uniform, "runs": runs,
              "band_filter": band, "cost": cost,
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_avg": os.getloadavg()}}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
