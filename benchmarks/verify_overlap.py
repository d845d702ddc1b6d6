"""Rewards while generating: the verify phase's exposed seconds on MBPP, streaming on vs off
-> benchmarks/results/verify_overlap.json.

    python benchmarks/verify_overlap.py [--prompts 4] [--n 2] [--max-new-tokens 64] [--chunk 1] [--repeats 2]

The real rollout + verify of a training step (``reasonrl.trainer.streaming.generate_and_verify``): a RolloutWorker on
Ray (the real SmolLM2 with the hf engine) generates ``--n`` responses to each of ``--prompts`` MBPP prompts, and the
real code verifier runs each response's tests in the sandbox (``reward.verifier_options``: bwrap when usable), in a
VerifierPool of ``--workers`` processes. ``off``: one generate call, then ``verify_batch`` (the colocated default).
``on``: ``rollout.stream_chunk_prompts=--chunk``, each sub-batch's responses submitted to the pool as it is done.
Reported per mode (median over repeats, the modes alternating): ``timing_s/rollout``, ``timing_s/verify`` (the exposed
part: verification left after the last response) and their sum, plus the load average.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=1, help="prompts per streamed sub-batch in the 'on' mode")
    ap.add_argument("--workers", type=int, default=2, help="verifier pool processes")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS / "verify_overlap.json"))
    args = ap.parse_args()

    import ray

    from reasonrl.config import load_config, to_dict
    from reasonrl.controller import WorkerGroup, start_ray
    from reasonrl.data import PromptDataset
    from reasonrl.datasets import task_files
    from reasonrl.models import load_tokenizer, resolve_model_path
    from reasonrl.rewards import make_pool, verify_item
    from reasonrl.trainer.metrics import PhaseTimer
    from reasonrl.config.plan import RunPlan
    from reasonrl.hardware import local_hardware
    from reasonrl.trainer.streaming import generate_and_verify
    from reasonrl.workers.rollout_worker import RolloutWorker

    cfg, _ = load_config(["task=mbpp", "rollout.engine=hf", f"rollout.n={args.n}",
                          f"rollout.max_new_tokens={args.max_new_tokens}", f"reward.workers={args.workers}",
                          "trainer.device=cpu"], cuda_available=False)
    model_path = resolve_model_path(cfg.model.path)
    tokenizer = load_tokenizer(model_path)
    data = PromptDataset(task_files("mbpp", "train", cfg.data.train_files), tokenizer, cfg.data.max_prompt_length,
                         cfg.data.apply_chat_template, cfg.data.system_prompt)
    prompts = [data[i] for i in range(args.prompts)]
    plan = RunPlan.build(cfg, local_hardware(cfg.trainer.device))
    sampling = {**plan.training_sampling, "logprobs": False}
    start_ray("local", num_cpus=os.cpu_count() or 1)
    group = WorkerGroup(RolloutWorker, 1, False, max(1, (os.cpu_count() or 1) // 2),
                        {"config": to_dict(cfg), "model_path": model_path, "plan": plan.for_workers()})
    pool = make_pool(cfg.reward)
    runs = {"off": [], "on": []}
    try:
        pool.verify_batch([verify_item(data[0].row, "def f():\n    return 1\n", cfg.reward)])  # warm the sandbox
        for _ in range(args.repeats):
            for mode, chunk in (("off", 0), ("on", args.chunk)):
                timer = PhaseTimer()
                load = os.getloadavg()[0]
                samples = generate_and_verify(group, prompts, sampling, pool, cfg.reward, chunk, timer)
                stats = pool.pop_stats()
                runs[mode].append({**timer.metrics(), "responses": len(samples), "load_avg_1m": load,
                                   "mean_score": sum(s.result.score for s in samples) / len(samples),
                                   "verify_latency_p50_s": stats["verify/latency_p50_s"]})
                print(mode, runs[mode][-1], flush=True)
    finally:
        pool.close()
        group.shutdown()
        ray.shutdown()

    def median(mode: str, key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in runs[mode])

    summary = {mode: {"rollout_s": median(mode, "timing_s/rollout"), "verify_exposed_s": median(mode, "timing_s/verify"),
                      "rollout_plus_verify_s": median(mode, "timing_s/rollout") + median(mode, "timing_s/verify")}
               for mode in runs}
    out = {"benchmark": "verify_overlap", "when": time.strftime("%Y-%m-%d %H:%M:%S"), "task": "mbpp",
           "engine": "hf", "model": cfg.model.path, "prompts": args.prompts, "n": args.n,
           "max_new_tokens": args.max_new_tokens, "chunk_prompts": args.chunk, "pool_workers": args.workers,
           "repeats": args.repeats, "cpu_count": os.cpu_count(), "summary": summary, "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
