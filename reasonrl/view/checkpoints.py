"""The run's checkpoints and whether each verifies, by the trainer's own check (``verify_checkpoint`` of
``reasonrl.trainer.checkpoint``: every file's size and SHA-256 against ``manifest.json``). That module imports torch,
so it is imported here only when a run has checkpoints; a verdict is kept until the checkpoint's files change."""
from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any, Dict, List, Tuple

STEP_DIR = re.compile(r"^step_(\d{6,})$")
_verdicts: Dict[Tuple[str, float, float], Dict[str, Any]] = {}
_lock = threading.Lock()


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def checkpoint_dirs(run_dir: Path) -> List[Path]:
    """``checkpoints/step_NNNNNN`` directories (complete or not), oldest first; ``.tmp`` ones are not listed."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted((d for d in root.iterdir() if d.is_dir() and STEP_DIR.match(d.name)), key=lambda d: d.name)


def verify(ckpt: Path) -> Dict[str, Any]:
    """``{"ok": bool, "error": str}`` by ``verify_checkpoint``, cached by the checkpoint's files' times."""
    key = (str(ckpt), _mtime(ckpt / "trainer_state.json"), _mtime(ckpt / "manifest.json"))
    with _lock:
        if key in _verdicts:
            return _verdicts[key]
    from reasonrl.trainer.checkpoint import CheckpointError, verify_checkpoint

    try:
        verify_checkpoint(ckpt)
        verdict = {"ok": True, "error": ""}
    except CheckpointError as exc:
        verdict = {"ok": False, "error": str(exc)}
    with _lock:
        _verdicts[key] = verdict
    return verdict


def checkpoint_rows(run_dir: Path) -> List[Dict[str, Any]]:
    """One row per checkpoint: name, step, bytes, whether it has a manifest, and its verification."""
    rows = []
    for ckpt in checkpoint_dirs(run_dir):
        files = [p for p in ckpt.rglob("*") if p.is_file()]
        row = {"name": ckpt.name, "step": int(STEP_DIR.match(ckpt.name).group(1)),
               "bytes": sum(p.stat().st_size for p in files), "manifest": (ckpt / "manifest.json").is_file()}
        row.update(verify(ckpt))
        try:
            row["trainer_step"] = json.loads((ckpt / "trainer_state.json").read_text()).get("step")
        except (OSError, ValueError, AttributeError):
            row["trainer_step"] = None
        rows.append(row)
    return rows
