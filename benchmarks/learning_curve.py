"""Proof of learning: train on a task (default the generated arithmetic, ``--task``) and record reward and held-out
accuracy per step.

    python benchmarks/learning_curve.py --algorithm grpo --seeds 1 2 --steps 30 --val-every 5 \
        -- rollout.engine=hf data.train_batch_size=8 rollout.n=4 actor.lr=2e-6

Each seed runs ``python -m reasonrl.train task=arith algorithm=<algo> trainer.seed=<seed> ...`` (validation before
training and every ``--val-every`` steps on the held-out split, greedy), then this script reads the run's
``metrics.jsonl`` and writes ``benchmarks/results/learning_curve_<algo>.json`` and ``learning_curve_<algo>.png``
(training reward and held-out accuracy per step, one line per seed). ``--label`` names a variant instead of the
algorithm (its run directories and ``learning_curve_<label>.json``), so that e.g. LoRA and full fine-tuning at the
learning rate that suits each sit side by side:

    python benchmarks/learning_curve.py --label grpo_lora16 -- actor.lora.rank=16 actor.lr=2e-5
    python benchmarks/learning_curve.py --label grpo_full -- actor.lr=2e-6

The summary states held-out accuracy at step 0 and at the last validation (mean and std over seeds), the gain, and
two noise yardsticks: the run-to-run std of the final accuracy and the binomial standard error of a difference of two
accuracies on the ``N`` held-out prompts, sqrt(p0 (1 - p0) / N + p1 (1 - p1) / N). The gain counts as "beyond noise"
when it exceeds twice the larger of the two.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
STOP_GRACE_S = 60.0
"""How long a run stopped at ``--time-limit-s`` (SIGTERM) has to finish its step in flight and save a checkpoint before
it is killed (six SmolLM2 runs on one GPU each write about 1.6 GB then)."""


def train_in_process(train_args: List[str]) -> int:
    """``reasonrl.train.main(train_args)`` with the worker groups in this process (``--driver local``: the in-process
    backend, one thread per worker, no Ray). On a small shared CPU machine this avoids Ray's per-node daemons and
    memory monitor and the thread oversubscription of 2-thread workers."""
    from reasonrl.train import main as train_main
    from reasonrl.trainer.backends import InProcessBackend

    return train_main(train_args, backend=InProcessBackend(num_threads=int(os.environ.get("LEARNING_CURVE_THREADS",
                                                                                          "1"))))


def train_command(algorithm: str, seed: int, steps: int, val_every: int, run_dir: Path,
                  overrides: Sequence[str], task: str = "arith") -> List[str]:
    """The exact ``reasonrl.train`` command line of one seed (user overrides come last and win)."""
    return [sys.executable, "-m", "reasonrl.train", f"task={task}", f"algorithm={algorithm}", f"trainer.seed={seed}",
            f"rollout.seed={seed}", f"trainer.total_steps={steps}", f"trainer.val_every={val_every}",
            "trainer.val_before_train=true", f"trainer.output_dir={run_dir}", "trainer.resume=never",
            "trainer.save_every=0", "trainer.logger=[console,jsonl]", *overrides]


def read_metrics(path: Path) -> List[Dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` (one JSON object per logged step); none when the run logged nothing."""
    rows: List[Dict[str, Any]] = []
    if not path.exists():
        return rows
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


def curves(rows: List[Dict[str, Any]]) -> Dict[str, List[List[float]]]:
    """``[step, value]`` pairs of the training reward/accuracy and the held-out accuracy/reward."""
    out: Dict[str, List[List[float]]] = {"reward/mean": [], "reward/accuracy": [], "val/accuracy": [],
                                         "val/reward_mean": [], "timing_s/step": []}
    for r in rows:
        for key in out:
            if key in r and r[key] is not None:
                out[key].append([int(r["step"]), float(r[key])])
    return out


def _mean_std(xs: List[float]) -> Dict[str, float]:
    return {"mean": statistics.fmean(xs) if xs else float("nan"),
            "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "values": xs}


def summarize(runs: List[Dict[str, Any]], val_size: int) -> Dict[str, Any]:
    """Held-out accuracy at step 0 and at the end, over seeds, with the noise yardsticks (see module docstring)."""
    start = [r["curves"]["val/accuracy"][0][1] for r in runs if r["curves"]["val/accuracy"]]
    end = [r["curves"]["val/accuracy"][-1][1] for r in runs if r["curves"]["val/accuracy"]]
    gains = [e - s for s, e in zip(start, end)]
    s, e = _mean_std(start), _mean_std(end)
    p0, p1 = s["mean"], e["mean"]
    binom_se = math.sqrt(max(p0 * (1 - p0), 0) / val_size + max(p1 * (1 - p1), 0) / val_size) if val_size else 0.0
    noise = max(e["std"], s["std"], binom_se)
    gain = _mean_std(gains)
    return {
        "val_accuracy_step0": s, "val_accuracy_final": e, "gain": gain,
        "noise": {"final_std_over_seeds": e["std"], "step0_std_over_seeds": s["std"],
                  "binomial_se_of_difference": binom_se, "val_prompts": val_size},
        "improved_beyond_noise": bool(gain["mean"] > 2 * noise and all(g > 0 for g in gains)),
        "train_reward_first_last": [[r["curves"]["reward/mean"][0][1], r["curves"]["reward/mean"][-1][1]]
                                    for r in runs if r["curves"]["reward/mean"]],
    }


def plot(runs: List[Dict[str, Any]], algorithm: str, path: Path, task: str = "arith") -> None:
    """Two panels: training reward per step, held-out accuracy per validation (one line per seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_v) = plt.subplots(1, 2, figsize=(11, 4))
    for r in runs:
        c = r["curves"]
        if c["reward/mean"]:
            ax_r.plot(*zip(*c["reward/mean"]), label=f"seed {r['seed']}", alpha=0.8)
        if c["val/accuracy"]:
            ax_v.plot(*zip(*c["val/accuracy"]), marker="o", label=f"seed {r['seed']}")
    ax_r.set(title=f"{algorithm}: training reward ({task})", xlabel="step", ylabel="mean reward")
    ax_v.set(title=f"{algorithm}: held-out accuracy (greedy)", xlabel="step", ylabel="accuracy")
    for ax in (ax_r, ax_v):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def seed_command(algorithm: str, seed: int, args, overrides: Sequence[str], name: Optional[str] = None,
                 task: str = "arith", script: Optional[Path] = None) -> List[str]:
    """The command line of one seed: ``reasonrl.train``, or (``--driver local``) ``script``'s in-process trainer
    (default this script's). ``name`` (default the algorithm) names the run's folder, ``<name>_seed<seed>``."""
    run_dir = Path(args.runs_dir) / f"{name or getattr(args, 'label', None) or algorithm}_seed{seed}"
    cmd = train_command(algorithm, seed, args.steps, args.val_every, run_dir, overrides, task)
    if args.driver == "local":  # same arguments, trainer in-process (the in-process backend)
        cmd = [sys.executable, str(script or Path(__file__).resolve()), "--in-process-train", *cmd[3:],
               "trainer.num_workers=1"]
    return cmd


def run_seeds(algorithm: str, args, overrides: Sequence[str], name: Optional[str] = None, task: str = "arith",
              script: Optional[Path] = None, keep_failed: bool = False) -> List[Dict[str, Any]]:
    """Train every seed (one after another, or all at once with ``--parallel``) and read back their curves.
    ``name``, ``task`` and ``script`` go to ``seed_command`` (benchmarks/curriculum.py runs one name per sampler).

    With ``--time-limit-s`` a run still going at the limit is stopped and keeps the steps it logged (its last
    validation is the curve's end; ``stopped_at_limit`` says so). A seed whose training fails raises, naming it and
    its log's tail; with ``keep_failed`` it is recorded instead (``failed``: the exit status and the log's tail,
    and the curves it logged) and the other seeds go on, so one crashed run does not lose the others' figures."""
    deadline = time.time() + args.time_limit_s if args.time_limit_s else None
    started: List[Dict[str, Any]] = []

    def finish(run: Dict[str, Any]) -> None:
        proc, timeout = run.pop("proc"), None
        if deadline is not None:
            timeout = max(deadline - time.time(), 1.0)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            run["stopped_at_limit"] = True
        run["log"].close()
        run["wall_s"] = round(time.time() - run["start"], 1)
        if proc.returncode != 0 and not run.get("stopped_at_limit"):
            tail = Path(run["log"].name).read_text()[-3000:]
            if not keep_failed:
                raise RuntimeError(f"seed {run['seed']}: training failed (exit {proc.returncode}); log "
                                   f"{run['log'].name}:\n{tail}")
            run["failed"] = {"exit": proc.returncode, "log": run["log"].name, "log_tail": tail[-1500:]}
            print(f"seed {run['seed']} ({name or algorithm}): training failed (exit {proc.returncode}); kept as "
                  f"failed, log {run['log'].name}", flush=True)

    for seed in args.seeds:
        cmd = seed_command(algorithm, seed, args, overrides, name, task, script)
        run_dir = Path(args.runs_dir) / f"{name or getattr(args, 'label', None) or algorithm}_seed{seed}"
        run = {"seed": seed, "command": " ".join(cmd[1:]), "driver": args.driver, "run_dir": str(run_dir),
               "wall_s": None, "stopped_at_limit": False}
        started.append(run)
        print("$", " ".join(cmd), flush=True)
        if args.reuse and (run_dir / "metrics.jsonl").exists():
            continue
        log_path = Path(args.runs_dir) / f"{name or getattr(args, 'label', None) or algorithm}_seed{seed}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
        if args.driver == "local":
            env["OMP_NUM_THREADS"] = env.get("LEARNING_CURVE_THREADS", "1")
        run["log"] = open(log_path, "w")
        run["start"] = time.time()
        run["proc"] = subprocess.Popen(cmd, cwd=ROOT, stdout=run["log"], stderr=subprocess.STDOUT, env=env)
        if not args.parallel:
            finish(run)
    for run in started:
        if "proc" in run:
            finish(run)
        run.pop("start", None)
        run.pop("log", None)
        rows = read_metrics(Path(run["run_dir"]) / "metrics.jsonl")
        run["curves"] = curves(rows)
        run["train_seconds"] = round(sum(v for _, v in run["curves"]["timing_s/step"]), 1)
    return started


def machine() -> Dict[str, Any]:
    """Where the runs trained: CPU count, platform and the GPU's name when there is one."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "gpu": gpu}


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--in-process-train"]:
        return train_in_process(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", default="grpo", help="an algorithm preset: grpo, ppo, rloo, ...")
    parser.add_argument("--label", default="",
                        help="the variant's name (run directories, learning_curve_<label>.json); default the algorithm")
    parser.add_argument("--task", default="arith",
                        help="a built-in task (reasonrl/config/tasks.py): its train split trained on, its validation "
                             "split held out; a task with upstream files reads them from $REASONRL_DATA_DIR")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--val-every", type=int, default=5)
    parser.add_argument("--val-size", type=int, default=64, help="held-out prompts (data.val_limit)")
    parser.add_argument("--runs-dir", default=str(ROOT / "outputs" / "learning_curve"))
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/learning_curve_<algo>.json)")
    parser.add_argument("--driver", choices=["ray", "local"], default="ray",
                        help="ray: the real command; local: the same trainer with its one worker in-process")
    parser.add_argument("--note", default="", help="free text stored in the JSON (e.g. why a run stopped early)")
    parser.add_argument("--reuse", action="store_true", help="read existing runs' metrics instead of training")
    parser.add_argument("--parallel", action="store_true", help="train the seeds at the same time (a GPU machine)")
    parser.add_argument("--time-limit-s", type=float, default=0.0,
                        help="stop runs still going after this many seconds; they keep the steps they logged")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for reasonrl.train (after --)")
    args = parser.parse_args(argv)
    from reasonrl.config.tasks import TASKS
    from reasonrl.datasets.common import data_dir_from_env, prepare  # arith: generated, deterministic per split

    if args.task not in TASKS:
        parser.error(f"--task {args.task!r}: not a built-in task ({', '.join(sorted(TASKS))})")
    task = TASKS[args.task]
    data = Path(args.runs_dir) / "data"
    train_file = prepare(task.recipe, task.train_split, data_dir_from_env(), out_dir=data)
    val_file = prepare(task.recipe, task.val_split, data_dir_from_env(), out_dir=data)
    overrides = [f"data.train_files=[{train_file}]", f"data.val_files=[{val_file}]", f"data.val_limit={args.val_size}",
                 *args.overrides]

    runs = run_seeds(args.algorithm, args, overrides, task=args.task)
    label = args.label or args.algorithm
    out = Path(args.out) if args.out else RESULTS / f"learning_curve_{label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    png = out.with_suffix(".png")
    result = {
        "benchmark": "learning_curve", "algorithm": args.algorithm, "label": label, "task": args.task, "seeds": args.seeds,
        "steps": args.steps, "val_every": args.val_every, "note": args.note, "time_limit_s": args.time_limit_s,
        "driver": args.driver, "overrides": overrides,
        "machine": machine(),
        "summary": summarize(runs, args.val_size), "runs": runs, "plot": str(png.relative_to(ROOT))
        if png.is_relative_to(ROOT) else str(png),
    }
    plot(runs, label, png, args.task)
    out.write_text(json.dumps(result, indent=2))
    s = result["summary"]
    print(f"{label}: held-out accuracy {s['val_accuracy_step0']['mean']:.3f} -> "
          f"{s['val_accuracy_final']['mean']:.3f} (gain {s['gain']['mean']:+.3f} ± {s['gain']['std']:.3f} over "
          f"{len(runs)} seeds; binomial SE {s['noise']['binomial_se_of_difference']:.3f}); "
          f"beyond noise: {s['improved_beyond_noise']}; wrote {out} and {png}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
