"""Checkpoint directories: ``<output_dir>/checkpoints/step_000010/``, written atomically (``.tmp``, then rename).

Inside: ``hf/`` (safetensors export; AutoModelForCausalLM loads it; also the model state for resume),
``actor_optim.pt`` (optimizer + scheduler), ``rng_rank<r>.pt``, ``trainer_state.json`` (step, data position),
``controller_rng.pt``, ``config.yaml`` and ``manifest.json`` (the size and SHA-256 of every other file, written
just before ``trainer_state.json``, whose bytes it lists too; resume checks it and falls back to an older checkpoint
when a file is damaged, and refuses to start when every checkpoint of the run is damaged).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch

from reasonrl.fault_points import fault_point

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"
TRAINER_STATE = "trainer_state.json"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (damaged or incomplete); the message names the file."""

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
        if m and (d / TRAINER_STATE).exists():
            found.append((int(m.group(1)), d))
    return [d for _, d in sorted(found)]


def resume_point(output_dir: str) -> str:
    """Where the same command would resume, in words: the newest complete checkpoint and the step that follows it, or
    that there is none (for the messages of a run that stops without saving the step in flight)."""
    found = list_checkpoints(output_dir)
    if not found:
        return (f"no checkpoint exists in {checkpoint_root(output_dir)}; running the same command again starts at "
                f"step 1 from model.path")
    step = int(STEP_DIR.match(found[-1].name).group(1))
    return (f"the last complete checkpoint is {found[-1]} (step {step}); running the same command again resumes at "
            f"step {step + 1}")


def finished_step(output_dir: str, resume: str, total_steps: int) -> Optional[int]:
    """The step of the checkpoint ``resume`` would continue from (``trainer.resume``: ``auto`` the newest, or a
    directory) when it is at ``total_steps`` or beyond and verifies: the run is complete, nothing to start. None
    otherwise (a damaged one is left to the trainer's choice, which names it)."""
    if resume == "never":
        return None
    found = list_checkpoints(output_dir) if resume == "auto" else [Path(resume)]
    if not found or not (found[-1] / TRAINER_STATE).exists():
        return None
    try:
        step = json.loads((found[-1] / TRAINER_STATE).read_text())["step"]
        if not isinstance(step, int) or step < total_steps:
            return None
        verify_checkpoint(found[-1])
    except (ValueError, KeyError, TypeError, CheckpointError):
        return None
    return step


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
    fault_point("checkpoint.written")
    state_bytes = json.dumps(trainer_state, indent=2).encode()
    write_manifest(tmp, {TRAINER_STATE: state_bytes})
    with open(tmp / TRAINER_STATE, "wb") as f:  # written last: its presence marks a complete checkpoint
        f.write(state_bytes)
        f.flush()
        os.fsync(f.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    fault_point("checkpoint.saved")
    if keep > 0:
        for old in list_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(directory: Path, to_be_written: Optional[Dict[str, bytes]] = None) -> None:
    """Record the size and SHA-256 of every file under ``directory`` (hashing reads each file once), and of the files
    ``to_be_written`` (name -> the bytes that will be written after the manifest: ``trainer_state.json``)."""
    to_be_written = to_be_written or {}
    files = sorted(p for p in Path(directory).rglob("*")
                   if p.is_file() and p.name != MANIFEST and str(p.relative_to(directory)) not in to_be_written)
    manifest = {str(p.relative_to(directory)): {"bytes": p.stat().st_size, "sha256": file_digest(p)} for p in files}
    for name, data in to_be_written.items():
        manifest[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    with open(Path(directory) / MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def verify_checkpoint(checkpoint: Path) -> None:
    """Raise CheckpointError naming the first file that is missing, of the wrong size or of the wrong checksum, or a
    ``trainer_state.json`` that does not hold a step and a data position. A checkpoint written before manifests
    existed is accepted as it is (its trainer state is still read)."""
    checkpoint = Path(checkpoint)
    state_file = checkpoint / TRAINER_STATE
    if not state_file.exists():
        raise CheckpointError(f"{checkpoint} is not a complete checkpoint (no {TRAINER_STATE})")
    try:
        state = json.loads(state_file.read_text())
        if not (isinstance(state, dict) and isinstance(state.get("step"), int) and "sampler" in state):
            raise ValueError("no integer 'step' and 'sampler'")
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{state_file}: not a trainer state ({exc})"[:300]) from None
    manifest_file = checkpoint / MANIFEST
    if not manifest_file.exists():
        log.warning("%s has no %s (written by an older reasonrl): its files are not verified", checkpoint, MANIFEST)
        return
    try:
        manifest = json.loads(manifest_file.read_text())
    except ValueError as exc:
        raise CheckpointError(f"{manifest_file}: not valid JSON ({exc})") from None
    for rel, want in manifest.items():
        path = checkpoint / rel
        if not path.is_file():
            raise CheckpointError(f"{path}: missing")
        size = path.stat().st_size
        if size != want["bytes"]:
            raise CheckpointError(f"{path}: {size} bytes, {want['bytes']} when saved (truncated or overwritten)")
        if file_digest(path) != want["sha256"]:
            raise CheckpointError(f"{path}: checksum differs from the one saved (the file is damaged)")


def usable_checkpoint(output_dir: str) -> Optional[Path]:
    """The newest checkpoint whose files verify; each damaged newer one is skipped with a warning naming the file.
    None when the run has no checkpoint. When it has checkpoints and none of them verifies, CheckpointError naming
    each damaged file and the choices: the run directory is never written over silently."""
    damaged: List[str] = []
    for ckpt in reversed(list_checkpoints(output_dir)):
        try:
            verify_checkpoint(ckpt)
        except CheckpointError as exc:
            print(f"reasonrl: warning: skipping damaged checkpoint: {exc}", flush=True)
            damaged.append(str(exc))
            continue
        if damaged:
            print(f"reasonrl: warning: resuming from the older checkpoint {ckpt}", flush=True)
        return ckpt
    if damaged:
        raise CheckpointError(
            f"every checkpoint in {checkpoint_root(output_dir)} is damaged ({'; '.join(damaged)}); nothing was "
            f"written. Choose: trainer.resume=<a checkpoint directory> to try one, another trainer.output_dir to "
            f"start fresh beside them, or trainer.resume=never to start over here (overwriting them)")
    return None


def drop_rows_after(metrics_file: Path, step: int) -> int:
    """Remove the rows of a per-step JSON Lines file (``metrics.jsonl``, ``samples.jsonl``) logged for steps after
    ``step`` (a run killed after logging a step but before its checkpoint was complete logs that step again on
    resume), and a torn last line. The file is cut in
    place, so a logger that holds it open in append mode keeps writing to it. Returns the rows removed."""
    metrics_file = Path(metrics_file)
    if not metrics_file.exists():
        return 0
    keep_bytes, dropped = 0, 0
    with open(metrics_file, "rb") as f:
        lines = f.readlines()
    for i, line in enumerate(lines):
        try:
            row_step = json.loads(line).get("step", 0)
        except ValueError:
            row_step = None
        if row_step is None or row_step > step:
            dropped = sum(1 for rest in lines[i:] if rest.strip())
            break
        keep_bytes += len(line)
    if dropped:
        with open(metrics_file, "r+b") as f:
            f.truncate(keep_bytes)
    return dropped


def read_trainer_state(checkpoint: Path) -> Dict[str, Any]:
    with open(Path(checkpoint) / TRAINER_STATE) as f:
        state = json.load(f)
    rng_file = Path(checkpoint) / "controller_rng.pt"
    if rng_file.exists():
        rng = torch.load(rng_file, weights_only=False)
        random.setstate(rng["python"])
        torch.set_rng_state(rng["torch"])
    return state
