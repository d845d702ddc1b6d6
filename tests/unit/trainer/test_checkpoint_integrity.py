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
    assert set(manifest) == {"hf/model.safetensors", "actor_optim.pt", "controller_rng.pt", "config.yaml",
                             "trainer_state.json"}
    assert manifest["trainer_state.json"]["bytes"] == (ckpt / "trainer_state.json").stat().st_size
    assert manifest["hf/model.safetensors"]["bytes"] == 256 * 41
    verify_checkpoint(ckpt)  # intact: no error


DAMAGES = ["truncate_weights", "truncate_optimizer", "flip_byte", "delete", "state_not_json", "state_same_size"]


def _damage(ckpt: Path, damage: str) -> str:
    """Damage one file of ``ckpt`` as ``damage`` says; returns the file's path inside the checkpoint."""
    target = {"truncate_weights": "hf/model.safetensors", "truncate_optimizer": "actor_optim.pt",
              "flip_byte": "hf/model.safetensors", "delete": "actor_optim.pt",
              "state_not_json": "trainer_state.json", "state_same_size": "trainer_state.json"}[damage]
    path = ckpt / target
    data = path.read_bytes()
    if damage.startswith("truncate"):
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip_byte":  # same size, different content: only the checksum sees it
        path.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif damage == "state_not_json":  # a torn or overwritten trainer state: named, not a JSON traceback
        path.write_bytes(b"\x00" * len(data))
    elif damage == "state_same_size":  # still valid JSON of the same size, another data position
        changed = data.replace(b'"offset": 2', b'"offset": 7')
        assert changed != data and len(changed) == len(data)
        path.write_bytes(changed)
    else:
        path.unlink()
    return target


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_file_is_named_and_resume_falls_back(tmp_path, damage, capsys):
    _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    target = _damage(newest, damage)
    with pytest.raises(CheckpointError, match=target.replace("/", ".")):
        verify_checkpoint(newest)
    chosen = usable_checkpoint(str(tmp_path))
    assert chosen == list_checkpoints(str(tmp_path))[0] and chosen.name == "step_000001"
    out = capsys.readouterr().out
    assert target in out and "step_000001" in out  # the warning names the file and the fallback


def test_every_checkpoint_damaged_is_refused_naming_each_file(tmp_path):
    assert usable_checkpoint(str(tmp_path)) is None  # a run without checkpoints starts from the initial model
    ckpt1, ckpt2 = _save(tmp_path, 1), _save(tmp_path, 2)
    (ckpt1 / "actor_optim.pt").write_bytes(b"")
    _damage(ckpt2, "state_not_json")
    with pytest.raises(CheckpointError) as err:
        usable_checkpoint(str(tmp_path))
    message = str(err.value)
    assert str(ckpt1 / "actor_optim.pt") in message and str(ckpt2 / "trainer_state.json") in message
    assert "trainer.resume=never" in message and "trainer.output_dir" in message


def test_train_refuses_a_run_whose_checkpoints_are_all_damaged_and_writes_nothing(tmp_path, capsys):
    """The real command on a run directory whose only checkpoints are truncated: exit 2 with one line naming the
    damaged files and the choices, before Ray starts; every file of the run directory is left as it was."""
    from reasonrl.train import main

    run = tmp_path / "run"
    for step in (1, 2):
        _damage(_save(run, step), "truncate_weights")
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in run.rglob("*") if p.is_file()}
    status = main(["rollout.engine=hf", "trainer.logger=[jsonl]", f"trainer.output_dir={run}"])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("reasonrl:")]
    assert status == 2
    assert len(err) == 1 and "every checkpoint" in err[0] and "step_000002" in err[0], err
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in run.rglob("*") if p.is_file()}
    assert after == before
    import ray

    assert not ray.is_initialized()


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


def test_finished_step_is_the_verified_checkpoint_at_total_steps(tmp_path):
    from reasonrl.trainer.checkpoint import finished_step

    run = tmp_path / "run"
    assert finished_step(str(run), "auto", 2) is None  # no checkpoint at all
    _save(run, 1)
    assert finished_step(str(run), "auto", 2) is None  # step 1 of 2: more to train
    last = _save(run, 2)
    assert finished_step(str(run), "auto", 2) == 2
    assert finished_step(str(run), "auto", 1) == 2  # total_steps lowered below the checkpoint: nothing to train either
    assert finished_step(str(run), "auto", 3) is None  # total_steps raised: train on
    assert finished_step(str(run), "never", 2) is None  # starting over is not a finished run
    assert finished_step(str(run), str(run / "checkpoints" / "step_000001"), 2) is None
    assert finished_step(str(run), str(last), 2) == 2
    _damage(last, "truncate_weights")
    assert finished_step(str(run), "auto", 2) is None  # left to the trainer, which names the file and falls back


def test_resume_point_names_the_newest_complete_checkpoint_or_none(tmp_path):
    from reasonrl.trainer.checkpoint import resume_point

    run = tmp_path / "run"
    root = run / "checkpoints"
    assert resume_point(str(run)) == (f"no checkpoint exists in {root}; running the same command again starts at "
                                      f"step 1 from model.path")
    _save(run, 1)
    _save(run, 2)
    (root / "step_000003.tmp").mkdir()  # a save cut short is not a resume point
    assert resume_point(str(run)) == (f"the last complete checkpoint is {root / 'step_000002'} (step 2); running the "
                                      f"same command again resumes at step 3")


def test_a_finished_run_says_so_and_exits_0_before_ray_or_the_model(tmp_path):
    """The real command, in a process of its own, on a run whose newest verified checkpoint is at total_steps: one
    line, exit 0, and Ray never imported (so never started); the model path is never read."""
    import subprocess
    import sys

    run = tmp_path / "run"
    _save(run, 3)
    code = ("import sys; from reasonrl.train import main; status = main(sys.argv[1:]); "
            "print('ray imported' if 'ray' in sys.modules else 'ray not imported'); sys.exit(status)")
    proc = subprocess.run([sys.executable, "-c", code, "task=gsm8k", "model.path=/nonexistent/model",
                           "rollout.engine=hf", "trainer.logger=[jsonl]", "trainer.total_steps=3",
                           f"trainer.output_dir={run}"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.splitlines() == [
        f"reasonrl: run complete at step 3 (a verified checkpoint in {run}/checkpoints); raise "
        f"trainer.total_steps to continue", "ray not imported"], proc.stdout + proc.stderr
    assert not (run / "metrics.jsonl").exists()
