"""``python -m reasonrl.eval`` samples with ``eval.*``: training's ``rollout.*`` sampling keys are mapped onto them
(or reported as ignored), never dropped silently. Each run here stops at config validation, before any model loads,
so what it validated shows which values the command used."""
import os
import subprocess
import sys

from reasonrl.config import load_config
from reasonrl.eval.cli import map_rollout_overrides


def _eval(tmp_path, *args):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "reasonrl.eval", "task=gsm8k", f"eval.output_dir={tmp_path}", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def test_rollout_sampling_keys_become_eval_keys():
    notes = []
    argv = map_rollout_overrides(["task=gsm8k", "rollout.n=4", "rollout.temperature=0.7", "+rollout.top_p=0.9",
                                  "rollout.max_new_tokens=64", "eval.k=[1,4]"], notes.append)
    cfg, _ = load_config(argv)
    assert (cfg.eval.n, cfg.eval.temperature, cfg.eval.top_p, cfg.eval.max_new_tokens) == (4, 0.7, 0.9, 64)
    assert "note: rollout.temperature=0.7 is taken as eval.temperature=0.7 (evaluation samples with eval.*)" in notes
    assert len(notes) == 4


def test_an_eval_key_given_too_wins_and_the_rollout_one_is_reported_ignored():
    notes = []
    cfg, _ = load_config(map_rollout_overrides(["rollout.temperature=0.7", "eval.temperature=0.2", "rollout.top_k=5",
                                                "rollout.val_temperature=0.5"], notes.append))
    assert cfg.eval.temperature == 0.2
    assert notes == ["warning: rollout.temperature=0.7 is ignored: evaluation samples with eval.temperature, also given",
                     "warning: rollout.top_k=5 is ignored by evaluation (evaluation samples without top-k)",
                     "warning: rollout.val_temperature=0.5 is ignored by evaluation (set eval.temperature)"]


def test_the_command_uses_a_mapped_key(tmp_path):
    # rollout.n=4 becomes eval.n=4, and rollout.temperature=0 becomes eval.temperature=0 given explicitly: greedy
    # with 4 samples is refused. Had rollout.* been ignored, eval.n=1 would have run (and loaded a model).
    run = _eval(tmp_path, "rollout.n=4", "eval.k=[1,4]", "rollout.temperature=0")
    assert run.returncode == 2 and "eval.temperature" in run.stderr, run.stderr
    assert "note: rollout.n=4 is taken as eval.n=4" in run.stderr
    assert "note: rollout.temperature=0 is taken as eval.temperature=0" in run.stderr
