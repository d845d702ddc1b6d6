"""Why the drift check fired on plain answers (``env/drift_rate`` 0.38-0.56 in benchmarks/results/
env_learning_search.json, no tool call made): sample answers to ``search`` rows from the real SmolLM2-135M-Instruct
with the hf engine through the multi-turn loop and, for each trajectory, record the drift check's verdict
(``identical`` / ``noncanonical`` / ``boundary``, ``reasonrl.envs.chat``) and, where the trained tokens differ from
the template's rendering, the first difference: the sampled tokens next to the canonical encoding of their text.

    python benchmarks/drift_cause.py [--prompts 4] [--n 4] [--max-new-tokens 256] \
        [--out benchmarks/results/drift_cause.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from collections import Counter
from pathlib import Path

import torch

from reasonrl.config.env_schema import EnvConfig
from reasonrl.data.prompts import render_prompt
from reasonrl.datasets import search as search_data
from reasonrl.envs.prompting import row_tools
from reasonrl.models import load_tokenizer, resolve_model_path
from reasonrl.rollout import SamplingParams
from reasonrl.rollout.hf_engine import HFRolloutEngine
from reasonrl.rollout.multiturn import ToolRollout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/results/drift_cause.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    path = resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")
    tok = load_tokenizer(path)
    engine = HFRolloutEngine.from_pretrained(path, tok, torch.float32, "cpu")
    rows = search_data.build_rows("train")[:args.prompts]
    prompts = [render_prompt(tok, r["prompt"], tools=row_tools(r)) for r in rows]
    loop = ToolRollout(engine, tok, None, max_turns=4, env_cfg=EnvConfig(), default_env=None)
    start = time.monotonic()
    out = loop.generate(prompts, SamplingParams(n=args.n, max_new_tokens=args.max_new_tokens, seed=args.seed,
                                                logprobs=False), rows=rows)
    seconds = time.monotonic() - start
    loop.close()
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    kinds, records = Counter(), []
    for c in (c for group in out for c in group):
        kind = "boundary" if c.env_drift == 1 else "noncanonical" if c.env_noncanonical == 1 else \
            "identical" if c.env_drift == 0 else "unchecked"
        kinds[kind] += 1
        model = [t for t, m in zip(c.token_ids, c.tool_mask) if not m]
        body = model[:-1] if model and model[-1] == tok.eos_token_id else model
        canonical = enc(tok.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False))
        record = {"kind": kind, "tool_calls": c.tool_calls, "finish_reason": c.finish_reason,
                  "model_tokens": len(body), "canonical_tokens": len(canonical)}
        if canonical != body:
            j = next((i for i, (a, b) in enumerate(zip(body, canonical)) if a != b), min(len(body), len(canonical)))
            record.update(first_difference=j, sampled=tok.convert_ids_to_tokens(body[max(0, j - 2):j + 4]),
                          canonical=tok.convert_ids_to_tokens(canonical[max(0, j - 2):j + 4]))
        records.append(record)
    checked = sum(v for k, v in kinds.items() if k != "unchecked")
    result = {"benchmark": "drift_cause", "model": "SmolLM2-135M-Instruct", "engine": "hf", "task": "search",
              "prompts": args.prompts, "n": args.n, "max_new_tokens": args.max_new_tokens, "seed": args.seed,
              "temperature": 1.0, "generate_seconds": round(seconds, 1),
              "machine": {"platform": platform.platform(), "gpu": None},
              "kinds": dict(kinds), "checked": checked,
              "old_drift_rate": (kinds["noncanonical"] + kinds["boundary"]) / max(1, checked),
              "drift_rate": kinds["boundary"] / max(1, checked),
              "noncanonical_rate": kinds["noncanonical"] / max(1, checked),
              "model_turns_not_canonical": sum("sampled" in r for r in records),
              "trajectories": records}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "trajectories"}, indent=1))


if __name__ == "__main__":
    main()
