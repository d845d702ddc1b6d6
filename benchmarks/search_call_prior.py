"""How likely the base model is to open its answer with a tool call, per ``search`` prompt style (no training, no
generation): for each of the first ``--prompts`` training questions, the probability that the response starts with
the tokens of ``<tool_call>`` (teacher-forced, one forward pass per prompt), and whether greedy decoding's first token
is the first of them. A cheap stand-in for the call rate: GRPO needs some calls in a group to see any reward.

    python benchmarks/search_call_prior.py --prompts 24     # writes benchmarks/results/search_call_prior.json

Styles: ``search`` (``task=search``'s system message), ``search_example`` (``task=search_example``'s: one worked
call and its answer) and ``examples_N`` for each N of ``--examples`` (the first N of ``search_example.EXAMPLES`` in
chat turns, as ``task=search_examples`` shows its ``SHOWN``). All offer the tool as the trainer does
(``reasonrl.envs.prompting``).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--examples", type=int, nargs="*", default=[2, 3],
                    help="also measure the prompt with the first N worked examples, for each N")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "search_call_prior.json"))
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    from reasonrl.data.prompts import render_prompt
    from reasonrl.datasets import search, search_example
    from reasonrl.envs.prompting import row_tools
    from reasonrl.models import load_tokenizer, resolve_model_path

    path = resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    target = tok("<tool_call>", add_special_tokens=False)["input_ids"]
    out = {"benchmark": "search_call_prior", "model": path, "prompts": args.prompts, "styles": {}}
    styles = [("search", search.build_rows), ("search_example", search_example.build_rows)]
    styles += [(f"examples_{n}", lambda split, n=n: search_example.rows_with(split, n)) for n in args.examples]
    for style, build_rows in styles:
        t0, probs, greedy = time.perf_counter(), [], 0
        for row in build_rows("train")[:args.prompts]:
            ids = render_prompt(tok, row["prompt"], tools=row_tools(row))
            with torch.no_grad():
                logp = model(torch.tensor([ids + target])).logits[0].float().log_softmax(-1)
            probs.append(math.exp(sum(logp[len(ids) - 1 + i, t].item() for i, t in enumerate(target))))
            greedy += int(logp[len(ids) - 1].argmax().item() == target[0])
        out["styles"][style] = {"p_starts_with_call_mean": sum(probs) / len(probs), "greedy_first_token": greedy,
                                "seconds": time.perf_counter() - t0}
        print(style, out["styles"][style], flush=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
