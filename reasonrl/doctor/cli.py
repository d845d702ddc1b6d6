"""Preflight checks: ``python -m reasonrl.doctor [key=value ...] [--json]``.

Checks Python, torch, CUDA/GPUs (on a GPU machine also the driver against torch's CUDA, each GPU's free memory,
NCCL, and the vLLM build against the supported range), Ray, transformers, vLLM (import, and whether it was built for
the installed torch), the Docker daemon, bubblewrap as a non-root uid, a Lean REPL, the optional logger packages, disk
and memory; prints what each missing piece disables and how to fix it. With ``key=value`` arguments it also checks
what that training config needs (``requirements``).
"""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence

from reasonrl.config import ConfigError, load_config

from .checks import (Check, check_bwrap, check_cuda, check_disk, check_docker, check_lean, check_memory, check_package,
                     check_python, check_torch, check_vllm)
from .gpu import gpu_checks
from .plan import plan_main
from .requirements import Problem, check_requirements


def run_checks(output_dir: str | Path = ".") -> List[Check]:
    """Every check, in the order the table shows them (the GPU rows right after ``cuda``, on GPU machines)."""
    checks: List[Callable[[], Any]] = [
        check_python, check_torch, check_cuda, gpu_checks,
        lambda: check_package("ray", "everything (the controller and workers are Ray actors)", "pip install ray",
                              required=True),
        lambda: check_package("transformers", "everything (models and tokenizers)", "pip install transformers",
                              required=True),
        check_vllm, check_docker, check_bwrap, check_lean,
        lambda: check_package("tensorboard", "trainer.logger=[...,tensorboard]", "pip install tensorboard"),
        lambda: check_package("wandb", "trainer.logger=[...,wandb]", "pip install wandb"),
        lambda: check_disk(output_dir), check_memory,
    ]
    rows: List[Check] = []
    for check in checks:
        found = check()
        rows += found if isinstance(found, list) else [found]
    return rows


def format_table(checks: Sequence[Check], width: int = 110) -> str:
    """The checks as a table, then what each missing piece disables and how to fix it."""
    mark = {"ok": "ok", "warn": "MISSING", "error": "ERROR"}
    name_w = max(len(c.name) for c in checks) + 2
    lines = [f"{'check':<{name_w}}{'status':<9}found", "-" * width]
    for c in checks:
        detail = textwrap.shorten(c.detail, width - name_w - 9, placeholder="...")
        lines.append(f"{c.name:<{name_w}}{mark.get(c.status, c.status):<9}{detail}")
    missing = [c for c in checks if not c.ok]
    if missing:
        lines += ["", "What is missing, what it disables, and the fix:"]
        for c in missing:
            lines += textwrap.wrap(f"{c.name}: disables {c.disables or 'nothing essential'}.", width,
                                   initial_indent="  - ", subsequent_indent="    ")
            lines += textwrap.wrap(f"fix: {c.fix}", width, initial_indent="    ", subsequent_indent="      ")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m reasonrl.doctor``: exit status 1 when a check is an error or the given config misses a piece."""
    parser = argparse.ArgumentParser(prog="python -m reasonrl.doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="a training config to check too, e.g. "
                             "task=mbpp reward.verifier_options.code.sandbox=docker")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--plan", action="store_true",
                        help="print the memory plan of the config (each phase's peak per GPU) instead of the checks")
    parser.add_argument("--device-gib", type=float, default=None, help="--plan: the GPU's memory (default: this GPU)")
    parser.add_argument("--host-gib", type=float, default=None,
                        help="--plan: the host's memory, for the host plan of offloaded state (default: this host)")
    parser.add_argument("--gpus", type=int, default=None, help="--plan: GPUs (data-parallel ranks)")
    args = parser.parse_intermixed_args(argv)  # key=value arguments before and after the options
    if args.plan:
        return plan_main(args.overrides, args.device_gib, args.gpus, args.host_gib)
    problems: Optional[List[Problem]] = None
    output_dir = "."
    if args.overrides:
        try:
            config, _ = load_config(args.overrides)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        output_dir = config.trainer.output_dir
        problems = check_requirements(config)
    checks = run_checks(output_dir)
    if args.json:
        print(json.dumps({"checks": [asdict(c) for c in checks],
                          "problems": None if problems is None else [asdict(p) for p in problems]}, indent=2))
    else:
        print(format_table(checks))
        if problems is not None:
            print(f"\nThis config ({' '.join(args.overrides)}):")
            print("  everything it needs is present" if not problems else "\n".join(f"  - {p}" for p in problems))
    failed = any(c.status == "error" for c in checks) or bool(problems)
    return 1 if failed else 0

