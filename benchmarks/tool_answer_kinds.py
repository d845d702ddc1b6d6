"""What a search-task model did with the tool's answers, per validation step -> JSON.

Reads a run's ``val_samples.jsonl`` (``trainer.log_val_samples=N``: the held-out trajectories of every validation)
of ``task=search_example(s)`` and sorts each answer into one kind:

* ``right``: the verifier scored it correct;
* ``no_call``: no tool result in the trajectory;
* ``no_answer``: no year in the last assistant message;
* ``one_hop``: a two-hop question ("the city where X was born") answered after one search, with the person's birth
  year from that search instead of the city's founding year;
* ``distractor``: a wrong year that the tool returned (from another article of the results, for instance);
* ``not_in_tool``: a wrong year that no tool result holds.

Per step it also counts the answers with a ``\boxed{}`` in the last assistant message, those the length cap ended
(``finish_reason`` "length"), and those whose last message holds the true year anywhere (right or not: the fact was
found, whatever the verifier then read).

The question types are ``born`` ("In what year was X born?"), ``founded`` ("... the city of Y founded?") and
``two_hop`` ("... the city where X was born founded?"). Across validation steps the script also counts, per
question, right -> wrong and wrong -> right changes, and how the wrong kinds moved.

    python benchmarks/tool_answer_kinds.py --samples RUN/val_samples.jsonl --out benchmarks/results/X.json
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
from pathlib import Path
from typing import Any, Dict, List, Optional

KINDS = ("right", "no_call", "no_answer", "one_hop", "distractor", "not_in_tool")
YEAR = re.compile(r"\b(\d{3,4})\b")
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def question(prompt: str) -> str:
    """The last user turn of a rendered prompt (the held-out question; earlier turns are the worked examples)."""
    return prompt.rsplit("\nuser\n", 1)[-1].split("\nassistant", 1)[0].strip()


def question_type(text: str) -> str:
    if "city where" in text:
        return "two_hop"
    return "founded" if "founded" in text else "born"


def turns(conversation: str) -> List[tuple]:
    """(role, text) of each ``[role]`` block of a logged trajectory."""
    parts = re.split(r"^\[(assistant|tool|user)\]\n", conversation, flags=re.M)
    return [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2)]


def final_answer(text: str) -> Optional[str]:
    """The year in the last ``\\boxed{}``, else the last number of 3-4 digits; None without one."""
    boxed = BOXED.findall(text)
    if boxed:
        found = YEAR.findall(boxed[-1])
        if found:
            return found[-1]
    found = YEAR.findall(text)
    return found[-1] if found else None


def row_turns(row: Dict[str, Any]) -> List[tuple]:
    """The turns of a logged row's trajectory (a single-turn row: its response as one assistant turn)."""
    return turns(row.get("conversation") or "[assistant]\n" + row.get("response", ""))


def last_message(blocks: List[tuple]) -> str:
    """The text of the last assistant turn."""
    return next((text for role, text in reversed(blocks) if role == "assistant"), "")


def answer_kind(row: Dict[str, Any]) -> str:
    """One row of val_samples.jsonl -> one of KINDS."""
    if row.get("correct"):
        return "right"
    blocks = row_turns(row)
    tool_texts = [text for role, text in blocks if role == "tool"]
    if not tool_texts:
        return "no_call"
    answer = final_answer(last_message(blocks))
    if answer is None:
        return "no_answer"
    if question_type(question(row["prompt"])) == "two_hop" and len(tool_texts) == 1:
        first_hit = tool_texts[0].strip().splitlines()[0] if tool_texts[0].strip() else ""
        if "born in the year" in first_hit and answer in YEAR.findall(first_hit):
            return "one_hop"
    if any(answer in YEAR.findall(text) for text in tool_texts):
        return "distractor"
    return "not_in_tool"


def summarize(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    by_step: Dict[int, Dict[str, str]] = collections.defaultdict(dict)
    types: Dict[str, str] = {}
    form: Dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for row in rows:
        q = question(row["prompt"])
        types[q] = question_type(q)
        step = int(row["step"])
        by_step[step][q] = answer_kind(row)
        last = last_message(row_turns(row))
        form[step]["answers"] += 1
        form[step]["boxed"] += "\\boxed{" in last
        form[step]["length_capped"] += row.get("finish_reason") == "length"
        form[step]["truth_in_last_message"] += str(row.get("ground_truth", "")) in YEAR.findall(last)
    steps = sorted(by_step)
    out: Dict[str, Any] = {"steps": steps, "questions": len(types), "per_step": {}, "changes": {}}
    for step in steps:
        kinds = by_step[step]
        table = {t: {k: 0 for k in KINDS} for t in ("born", "founded", "two_hop", "all")}
        for q, kind in kinds.items():
            table[types[q]][kind] += 1
            table["all"][kind] += 1
        out["per_step"][str(step)] = table
        out.setdefault("form", {})[str(step)] = dict(form[step])
    for a, b in zip(steps, steps[1:]):
        common = set(by_step[a]) & set(by_step[b])
        moves = collections.Counter(f"{by_step[a][q]} -> {by_step[b][q]}" for q in common
                                    if by_step[a][q] != by_step[b][q])
        out["changes"][f"{a}->{b}"] = {
            "right_to_wrong": sum(1 for q in common if by_step[a][q] == "right" != by_step[b][q]),
            "wrong_to_right": sum(1 for q in common if by_step[a][q] != "right" == by_step[b][q]),
            "moves": dict(moves.most_common()),
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=Path, required=True, help="a run's val_samples.jsonl (or .jsonl.gz)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    opener = gzip.open if args.samples.suffix == ".gz" else open
    with opener(args.samples, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    result = {"benchmark": "tool_answer_kinds", "samples": str(args.samples), **summarize(rows)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    for step, table in result["per_step"].items():
        print(f"step {step}: " + ", ".join(f"{k} {v}" for k, v in table["all"].items()) + " | "
              + ", ".join(f"{k} {v}" for k, v in result["form"][step].items()))
    for span, change in result["changes"].items():
        print(f"{span}: right -> wrong {change['right_to_wrong']}, wrong -> right {change['wrong_to_right']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
