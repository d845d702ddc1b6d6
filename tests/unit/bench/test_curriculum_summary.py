"""benchmarks/curriculum.py's summary of steps to a fixed accuracy (issue 50 item 2): each run's first validation
step at the target, up to the step every run reached, worked by hand on written curves (no training)."""
from __future__ import annotations

import pytest
from helpers import benchmark_module
from paths import REPO


@pytest.fixture
def curriculum(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # it imports learning_curve beside it
    module = benchmark_module("curriculum")
    module.LEVELS = ("l1", "l2")
    return module


def run(seed, l1, l2):
    """Curves of [step, rollouts, accuracy] at validation steps 0, 10, 20, 30 (256 rollouts a step)."""
    return {"seed": seed, "curves": {
        "val/l1/accuracy": [[s, 256 * s, v] for s, v in zip((0, 10, 20, 30), l1)],
        "val/l2/accuracy": [[s, 256 * s, v] for s, v in zip((0, 10, 20, 30), l2)],
        "val/accuracy": [[s, 256 * s, (a + b) / 2] for s, a, b in zip((0, 10, 20, 30), l1, l2)]}}


def test_first_step_at_the_target_per_level_and_sampler(curriculum):
    runs = {"uniform": [run(1, [0.1, 0.3, 0.5, 0.6], [0.0, 0.0, 0.1, 0.4]),
                        run(2, [0.0, 0.1, 0.2, 0.7], [0.0, 0.0, 0.0, 0.0])],
            "pass_rate": [run(1, [0.2, 0.4, 0.6, 0.6], [0.0, 0.2, 0.3, 0.3]),
                          run(2, [0.0, 0.3, 0.3, 0.3], [0.0, 0.1, 0.2, 0.3])]}
    out = curriculum.steps_to_target(runs, 0.2, 20)  # step 30 is past the common step: not counted
    l1, l2, both = out["levels"]["l1"], out["levels"]["l2"], out["levels"]["all"]
    assert out["target"] == 0.2 and out["up_to_step"] == 20
    # uniform l1: seed 1 reaches 0.3 at 10, seed 2 reaches 0.2 at 20 -> mean 15, std of (10, 20) = 7.07
    assert l1["uniform"]["steps"] == [10, 20] and l1["uniform"]["mean"] == 15.0
    assert l1["uniform"]["std"] == pytest.approx(7.0711, abs=1e-4)
    # pass_rate l1: 0.2 at step 0 already (>= target), seed 2 at 10
    assert l1["pass_rate"]["steps"] == [0, 10] and l1["pass_rate"]["mean"] == 5.0
    # uniform l2: seed 1's 0.4 comes at step 30, past the common step; neither run reaches it by 20
    assert l2["uniform"] == {"steps": [None, None], "reached": 0, "runs": 2}
    assert l2["pass_rate"]["steps"] == [10, 20] and l2["pass_rate"]["reached"] == 2
    # all levels: uniform seed 1 (0.3 + 0.1) / 2 = 0.2 at step 20; seed 2 at most 0.1 by 20
    assert both["uniform"]["steps"] == [20, None] and both["uniform"]["reached"] == 1
    assert both["uniform"]["mean"] == 20.0 and both["uniform"]["std"] == 0.0


def test_no_common_step_gives_no_levels(curriculum):
    assert curriculum.steps_to_target({"uniform": []}, 0.2, None) == {"target": 0.2, "up_to_step": None,
                                                                         "levels": {}}
