"""Checkpoint directories: ``<output_dir>/checkpoints/step_000010/``, written atomically (``.tmp``, then rename).

Inside: ``hf/`` (safetensors export; AutoModelForCausalLM loads it; also the model state for resume),
``actor_optim.pt`` (optimizer + scheduler), ``rng_rank<r>.pt``, ``trainer_state.json`` (step, data position),
``controller_rng.pt`` and ``config.yaml``.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import torch

STEP_DIR = re.compile(r"^step_(\d{6,})$")


def checkpoint_root(output_dir: str) -> Path:
    return Path(output_dir) / "checkpoints"


def list_checkpoints(output_dir: str) -> list:
    """Completed checkpoints (no ``.tmp``), oldest first."""
    root = checkpoint_root(output_dir)
    if not root.exists():
        return []
    found = []
    for d in root.iterdir():
        m = STEP_DIR.match(d.name)
        if m and (d / "trainer_state.json").exists():
            found.append((int(m.group(1)), d))
    return [d for _, d in sorted(found)]


def latest_checkpoint(output_dir: str) -> Optional[Path]:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def save_checkpoint(output_dir: str, step: int, write_workers: Callable[[str], Any], trainer_state: Dict[str, Any],
                    config_yaml: str, keep: int = 0) -> Path:
    """Write a checkpoint for ``step`` atomically; ``write_workers(tmp_dir)`` lets the workers add their files."""
    root = checkpoint_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write_workers(str(tmp))
    torch.save({"python": random.getstate(), "torch": torch.get_rng_state()}, tmp / "controller_rng.pt")
    (tmp / "config.yaml").write_text(config_yaml)
    with open(tmp / "trainer_state.json", "w") as f:  # written last: its presence marks a complete checkpoint
        json.dump(trainer_state, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    if keep > 0:
        for old in list_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def read_trainer_state(checkpoint: Path) -> Dict[str, Any]:
    with open(Path(checkpoint) / "trainer_state.json") as f:
        state = json.load(f)
    rng_file = Path(checkpoint) / "controller_rng.pt"
    if rng_file.exists():
        rng = torch.load(rng_file, weights_only=False)
        random.setstate(rng["python"])
        torch.set_rng_state(rng["torch"])
    return state
