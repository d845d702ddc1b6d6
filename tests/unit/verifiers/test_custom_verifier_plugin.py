"""examples/custom_verifier is a real pip-installable plugin found through the ``reasonrl.verifiers`` entry point.

The test builds and installs it (``pip install --no-deps --no-build-isolation --target``) from a copy of
the example (so no build/ or egg-info lands in the repository), then finds it by name in a fresh
interpreter and inside VerifierPool workers.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reasonrl.verifiers import VerifierPool
from paths import REPO

EXAMPLE = REPO / "examples" / "custom_verifier"


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory) -> Path:
    """The folder the plugin was pip-installed into (its dist-info carries the entry point)."""
    root = tmp_path_factory.mktemp("plugin")
    source = root / "src"
    shutil.copytree(EXAMPLE, source)
    target = root / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    entry_points = list(target.glob("reasonrl_choice_verifier-*.dist-info/entry_points.txt"))
    assert entry_points and "choice = reasonrl_choice_verifier:MultipleChoiceVerifier" in entry_points[0].read_text()
    return target


def test_get_verifier_finds_the_installed_plugin(installed_plugin):
    # A fresh interpreter: entry points are read from the installed dist-info, not from this process.
    code = (
        "from reasonrl.verifiers import get_verifier, available_verifiers\n"
        "v = get_verifier('choice')\n"
        "print(type(v).__name__, 'choice' in available_verifiers())\n"
        "print(v.verify('Reasoning... The answer is (C).', 'C').score)\n"
        "print(v.verify('Reasoning... The answer is (B).', 'C').score)\n"
        "print(v.verify('no letter here', 'C').info['reason'])\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(installed_plugin)] + sys.path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:4] == ["MultipleChoiceVerifier True", "1.0", "0.0", "no choice letter found"]


def test_pool_workers_find_the_plugin_and_its_options(installed_plugin, monkeypatch):
    monkeypatch.syspath_prepend(str(installed_plugin))  # the pool hands its sys.path to the workers
    items = [
        ("choice", "\\boxed{B}", "B"),                 # boxed letter -> 1.0
        ("choice", "I pick (E).\nE", "E"),             # E is not a choice when choices="ABCD" -> 0.0
        ("math", "so \\boxed{72}", "72"),              # built-in verifiers still work in the same batch
        ("choice", "answer: A", "D"),                  # wrong letter -> 0.0
    ]
    with VerifierPool(workers=1, timeout_s=30, verifier_options={"choice": {"choices": "ABCD"}}) as pool:
        results = pool.verify_batch(items)
    assert [r.score for r in results] == [1.0, 0.0, 1.0, 0.0]
    assert results[0].info["extracted"] == "B"
    assert "not one of ABCD" in results[1].info["reason"]
    assert results[3].info["extracted"] == "A"


def test_training_config_routes_rewards_to_the_plugin(installed_plugin, monkeypatch, tmp_path, data_dir):
    """``reward.verifier=choice`` in a training config: the trainer's own reward path (config -> verify_item ->
    make_pool) scores real dataset rows with the installed plugin, its options included."""
    from reasonrl.config import load_config
    from reasonrl.datasets import read_rows, task_files
    from reasonrl.rewards import make_pool, verify_item

    monkeypatch.syspath_prepend(str(installed_plugin))
    monkeypatch.setenv("REASONRL_CACHE", str(tmp_path / "cache"))
    cfg, _ = load_config(["task=gsm8k", "reward.verifier=choice", "reward.workers=1",
                          "reward.verifier_options={choice: {choices: ABCD}}"], cuda_available=False)
    row = dict(read_rows(task_files("gsm8k", "val")[0])[0])
    gold_b = dict(row, reward_model={"style": "rule", "ground_truth": "B"})
    gold_e = dict(row, reward_model={"style": "rule", "ground_truth": "E"})
    items = [verify_item(gold_b, "The answer is (B).", cfg.reward),
             verify_item(gold_e, "The answer is (E).", cfg.reward),  # E counts only with the default "ABCDE"
             verify_item(gold_b, "\\boxed{18}", cfg.reward)]
    assert [item.verifier for item in items] == ["choice"] * 3  # the config overrides the row's own verifier ("math")
    with make_pool(cfg.reward) as pool:
        results = pool.verify_batch(items)
    assert [r.score for r in results] == [1.0, 0.0, 0.0]
    assert "not one of ABCD" in results[1].info["reason"]  # the options reached the plugin in the pool worker
