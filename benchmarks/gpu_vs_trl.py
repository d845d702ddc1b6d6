"""Our GRPO step against TRL's ``GRPOTrainer``, from the JSONs of one lease -> ``results/gpu_vs_trl.json``.

    python benchmarks/gpu_vs_trl.py --ours-fixed results/s14_ours_fixed.json --ours-longtail ... \\
        --trl-matched-fixed ... --trl-matched-longtail ... [--trl-default-fixed ...] [--trl-default-longtail ...]

Keys ``vs_trl_{default,matched}_{fixed,longtail}``: median seconds per timed step, ours / TRL's, with each side's
median, min, max and step count (``reasonrl/bench/peer_ratio.py``). *matched*: TRL with
``vllm_importance_sampling_correction=False`` (generate, reference and update: the passes of ours), the same
micro-batch rows, and our engine at TRL's scheduler limits (``rollout.max_num_seqs``, ``rollout.max_num_batched_tokens``);
*default*: TRL as it ships. A pair whose two runs name different GPUs, or a run not given, is recorded as ``null``
with the reason.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from reasonrl.bench.peer_ratio import machine_of, ours_step_seconds, step_ratio, trl_step_seconds
from reasonrl.bench.records import RESULTS, write

TARGETS = {"vs_trl_matched_fixed": 0.45, "vs_trl_matched_longtail": 0.25}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for dist in ("fixed", "longtail"):
        p.add_argument(f"--ours-{dist}", type=Path)
        for kind in ("matched", "default"):
            p.add_argument(f"--trl-{kind}-{dist}", type=Path)
    p.add_argument("--out", type=Path, default=RESULTS / "gpu_vs_trl.json")
    args = p.parse_args(argv)
    result = {"benchmark": "gpu_vs_trl", "targets": {k: f"<= {v}" for k, v in TARGETS.items()}, "inputs": {}}
    machines = set()
    for dist in ("fixed", "longtail"):
        ours_path = getattr(args, f"ours_{dist}")
        for kind in ("default", "matched"):
            key, trl_path = f"vs_trl_{kind}_{dist}", getattr(args, f"trl_{kind}_{dist}")
            if ours_path is None or trl_path is None:
                result[key] = {"ratio": None, "why": "not run in this lease"}
                continue
            ours, trl = json.loads(ours_path.read_text()), json.loads(trl_path.read_text())
            result["inputs"][key] = {"ours": ours_path.name, "trl": trl_path.name}
            m_ours, m_trl = machine_of(ours), machine_of(trl)
            if m_ours != m_trl or m_ours is None:
                result[key] = {"ratio": None, "why": f"different or unnamed machines: {m_ours!r} vs {m_trl!r}"}
                continue
            machines.add(m_ours)
            result[key] = {**step_ratio(ours_step_seconds(ours), trl_step_seconds(trl)),
                           "cpus": (ours.get("machine") or {}).get("cpus")}
            if key in TARGETS and result[key]["ratio"] is not None:
                result[key]["target_met"] = result[key]["ratio"] <= TARGETS[key]
    result["machine"] = sorted(machines)[0] if len(machines) == 1 else sorted(machines)
    write(args.out, result)
    print(json.dumps({k: v.get("ratio") for k, v in result.items() if k.startswith("vs_trl_")}))


if __name__ == "__main__":
    main()
