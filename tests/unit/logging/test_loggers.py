"""Loggers: console line, metrics.jsonl, samples.jsonl, TensorBoard event files, W&B offline."""
from __future__ import annotations

import json

import pytest
from components import require_module

from reasonrl.config import ConfigError
from reasonrl.logging import RunLogger, make_logger
from reasonrl.logging.loggers import ConsoleLogger, choose_wandb_mode

METRICS = {"reward/mean": 0.25, "reward/accuracy": 0.5, "response_length/mean": 97.4, "actor/kl": 0.00123,
           "actor/entropy": 1.23456, "timing_s/step": 12.34, "perf/tokens_per_s": 456.7, "timing_s/rollout": 8.0,
           "actor/pg_loss": -0.1}
ROWS = [{"prompt": "What is 2+3?", "response": "5 \\boxed{5}", "reward": 1.0, "reason": "match"},
        {"prompt": "What is 7*6?", "response": "I think | 41\nso 41", "reward": 0.0, "reason": "wrong answer"}]


def test_console_line_shows_the_key_numbers(tmp_path, capsys):
    with make_logger(["console"], str(tmp_path), {}, "p", "e") as logger:
        logger.log(METRICS, step=3)
        logger.log({"reward/mean": 1.0, "val/accuracy": 0.3125}, step=4)
        logger.log_samples(ROWS, step=4)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3
    assert lines[2] == "  sample 1/2 @ step 4: reward=1.0 reason='match' response='5 \\\\boxed{5}'"
    # By hand: 0.25->0.250, 0.5->0.500, 97.4->97, 0.00123 (3 significant), 1.23456->1.235, 12.34->12.3s, 456.7->457
    assert lines[0] == ("step 3 | reward 0.250 | acc 0.500 | len 97 | kl 0.00123 | ent 1.235 | time 12.3s "
                        "| tok/s 457")
    assert lines[1] == "step 4 | reward 1.000 | val/accuracy 0.312"  # 0.3125 rounds half to even -> 0.312
    assert "pg_loss" not in lines[0]  # only the handful of keys, not every metric


def test_jsonl_writes_one_object_per_step_and_samples(tmp_path):
    import torch

    logger = make_logger(["jsonl"], str(tmp_path / "run"), {"a": 1}, "p", "e")
    logger.log(METRICS, step=1)
    logger.log({"reward/mean": torch.tensor(0.75), "actor/kl": float("nan"), "note": "x"}, step=2)
    logger.log_samples(ROWS, step=2)
    logger.log_val_samples(ROWS[:1], step=0)  # held out, its own file: samples.jsonl keeps the training rows
    logger.close()
    logger.close()  # idempotent
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["reward/accuracy"] == 0.5 and records[0]["timing_s/rollout"] == 8.0
    assert records[1]["reward/mean"] == 0.75  # a 0-d tensor became a number
    assert records[1]["actor/kl"] is None  # NaN is not valid JSON: written as null
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [2, 2]
    assert samples[1]["response"] == ROWS[1]["response"] and samples[1]["reason"] == "wrong answer"
    [held_out] = [json.loads(line) for line in (tmp_path / "run" / "val_samples.jsonl").read_text().splitlines()]
    assert held_out["step"] == 0 and held_out["response"] == ROWS[0]["response"]

    # A resumed run appends rather than truncating.
    with make_logger(["jsonl"], str(tmp_path / "run"), {}, "p", "e") as again:
        again.log({"reward/mean": 0.9}, step=3)
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 3


def test_unknown_logger_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer.logger.*'tensorbord'.*known: console, jsonl, tensorboard, wandb"):
        make_logger(["console", "tensorbord"], str(tmp_path), {}, "p", "e")


def test_names_may_come_as_a_comma_string_and_repeat(tmp_path):
    logger = make_logger("console,jsonl,console", str(tmp_path), {}, "p", "e")
    assert logger.names == ["console", "jsonl"]
    logger.close()


def test_tensorboard_writes_scalars_and_sample_text(tmp_path):
    require_module("tensorboard", "tensorboard (the dev extra)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = make_logger(["tensorboard"], str(tmp_path), {"trainer": {"seed": 1}}, "p", "e")
    logger.log({"reward/mean": 0.25}, step=1)
    logger.log({"reward/mean": 0.75, "flag": True}, step=2)
    logger.log_samples(ROWS, step=2)
    logger.close()
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    scalars = acc.Scalars("reward/mean")
    assert [(s.step, s.value) for s in scalars] == [(1, 0.25), (2, 0.75)]
    assert "flag" not in acc.Tags()["scalars"]  # bools are not scalars
    text_tags = acc.Tags()["tensors"]
    assert any(t.startswith("samples") for t in text_tags) and any(t.startswith("config") for t in text_tags)
    sample_text = acc.Tensors([t for t in text_tags if t.startswith("samples")][0])[0]
    body = sample_text.tensor_proto.string_val[0].decode()
    assert "wrong answer" in body and "I think \\| 41<br>so 41" in body  # pipe escaped, newline kept as <br>


def test_wandb_offline_without_key(tmp_path, monkeypatch):
    require_module("wandb", "wandb (the dev extra)")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, so no key
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    assert choose_wandb_mode()[0] == "offline"
    logger = make_logger(["wandb", "jsonl"], str(tmp_path / "run"), {"actor": {"lr": 1e-6}}, "proj", "exp1")
    logger.log({"reward/mean": 0.5}, step=1)
    logger.log_samples(ROWS, step=1)
    logger.close()
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert list(runs[0].glob("*.wandb"))  # the run's record, for `wandb sync`
    tables = list(runs[0].glob("files/media/table/samples_*.table.json"))
    assert len(tables) == 1
    table = json.loads(tables[0].read_text())
    assert table["columns"] == ["step", "prompt", "response", "reward", "reason"]
    assert table["data"][1][4] == "wrong answer"


class _BrokenBackend:
    """A backend whose log raises, standing in for a crashed third-party service."""

    name = "broken"
    essential = False

    def log(self, metrics, step):
        raise ConnectionError("service gone")

    def log_samples(self, rows, step):
        pass

    def close(self):
        pass


def test_a_failing_optional_backend_is_dropped_not_fatal(tmp_path, capsys):
    logger = RunLogger([ConsoleLogger(), _BrokenBackend()], tmp_path)
    with pytest.warns(UserWarning, match="'broken' failed"):
        logger.log({"reward/mean": 0.5}, step=1)
    assert logger.names == ["console"]
    logger.log({"reward/mean": 0.6}, step=2)
    assert capsys.readouterr().out.count("step ") == 2
