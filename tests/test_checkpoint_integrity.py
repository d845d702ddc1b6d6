"""Checkpoint files are verified against the sizes and checksums written at save time; a damaged checkpoint is named
and skipped for the previous complete one; metrics rows logged past the resumed step are dropped."""
import json
from pathlib import Path

import pytest

from reasonrl.trainer.checkpoint import (CheckpointError, drop_rows_after, list_checkpoints, save_checkpoint,
                                         usable_checkpoint, verify_checkpoint)


def _save(run: Path, step: int) -> Path:
    def write_workers(directory: str) -> None:  # what the workers write: weights in hf/, optimizer state
        (Path(directory) / "hf").mkdir()
        (Path(directory) / "hf" / "model.safetensors").write_bytes(bytes(range(256)) * (40 + step))
        (Path(directory) / "actor_optim.pt").write_bytes(b"optimizer state %d" % step * 100)

    return save_checkpoint(str(run), step, write_workers, {"step": step, "sampler": {"epoch": 0, "offset": step}},
                           "config: {}\n")


def test_manifest_lists_every_file_with_size_and_checksum(tmp_path):
    ckpt = _save(tmp_path, 1)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert set(manifest) == {"hf/model.safetensors", "actor_optim.pt", "controller_rng.pt", "config.yaml"}
    assert manifest["hf/model.safetensors"]["bytes"] == 256 * 41
    verify_checkpoint(ckpt)  # intact: no error


@pytest.mark.parametrize("damage", ["truncate_weights", "truncate_optimizer", "flip_byte", "delete"])
def test_damaged_file_is_named_and_resume_falls_back(tmp_path, damage, capsys):
    _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    target = {"truncate_weights": "hf/model.safetensors", "truncate_optimizer": "actor_optim.pt",
              "flip_byte": "hf/model.safetensors", "delete": "actor_optim.pt"}[damage]
    path = newest / target
    data = path.read_bytes()
    if damage.startswith("truncate"):
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip_byte":  # same size, different content: only the checksum sees it
        path.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    else:
        path.unlink()
    with pytest.raises(CheckpointError, match=target.replace("/", ".")):
        verify_checkpoint(newest)
    chosen = usable_checkpoint(str(tmp_path))
    assert chosen == list_checkpoints(str(tmp_path))[0] and chosen.name == "step_000001"
    out = capsys.readouterr().out
    assert target in out and "step_000001" in out  # the warning names the file and the fallback


def test_no_usable_checkpoint_when_the_only_one_is_damaged(tmp_path):
    ckpt = _save(tmp_path, 1)
    (ckpt / "actor_optim.pt").write_bytes(b"")
    assert usable_checkpoint(str(tmp_path)) is None


def test_metrics_rows_after_the_resumed_step_are_dropped_in_place(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "val/accuracy": 0.1}, {"step": 1, "x": 1}, {"step": 2, "x": 2}, {"step": 3, "x": 3}]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "x"')  # torn last line
    appender = open(metrics, "a")  # the logger holds the file open in append mode while resume cuts it
    assert drop_rows_after(metrics, 2) == 2  # step 3 and the torn row
    appender.write(json.dumps({"step": 3, "x": 33}) + "\n")
    appender.close()
    got = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in got] == [0, 1, 2, 3] and got[-1]["x"] == 33
    assert drop_rows_after(metrics, 3) == 0
    assert drop_rows_after(tmp_path / "absent.jsonl", 0) == 0
