"""The env config section: task presets of the environment tasks, and bad values refused naming the key."""
from __future__ import annotations

import pytest

from reasonrl.config import ConfigError, load_config


def test_environment_tasks_turn_the_loop_on_with_their_environment():
    search, _ = load_config(["task=search"], cuda_available=False)
    assert (search.tool.enabled, search.env.default, search.rollout.max_turns) == (True, "search", 4)
    code, _ = load_config(["task=code_feedback"], cuda_available=False)
    assert (code.tool.enabled, code.env.default, code.reward.timeout_s) == (True, "code_feedback", 30.0)
    math_tool, _ = load_config(["task=math_tool"], cuda_available=False)
    assert math_tool.env.default is None  # rows naming none run the tool, as before environments


@pytest.mark.parametrize("arg,key,why", [
    ("env.default=nope", "env.default", "unknown environment 'nope'"),
    ("env.drift_fatal=true", "env.drift_fatal", "needs env.drift_check=true"),
    ("env.step_timeout_s=0", "env.step_timeout_s", "out of range"),
    ("env.max_calls_per_turn=0", "env.max_calls_per_turn", "out of range"),
    ("env.placement=cluster", "env.placement", "must be one of local, ray"),
    ("env.num_actors=0", "env.num_actors", "out of range"),
    ("env.resources={env_node: -1}", "env.resources", "amounts >= 0"),
    ("env.placement=ray", "env.placement", "ray needs tool.enabled=true"),  # task=gsm8k: no environment runs
    ("env.resources={env_node: 1}", "env.resources", "needs env.placement=ray")])
def test_bad_env_values_are_refused_naming_the_key(arg, key, why):
    extra = ["env.drift_check=false"] if "drift_fatal" in arg else []
    with pytest.raises(ConfigError, match=f"config key '{key}'.*{why}"):
        load_config([arg, *extra], cuda_available=False)


def test_ray_placement_with_the_loop_is_planned():
    from reasonrl.config.plan import RunPlan

    cfg, _ = load_config(["task=search", "env.placement=ray", "env.resources={env_node: 1}"], cuda_available=False)
    assert (cfg.env.placement, cfg.env.resources, cfg.env.num_actors) == ("ray", {"env_node": 1}, 2)
    assert RunPlan.build(cfg).generator == "tools"


def test_environments_import_neither_torch_nor_ray():
    import subprocess
    import sys

    code = ("import sys, reasonrl.envs as e, reasonrl.envs.metrics, reasonrl.envs.steps, reasonrl.envs.remote\n"
            "print(e.available_environments(), 'torch' in sys.modules, 'ray' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "['code_feedback', 'python', 'search'] False False", proc.stderr[-2000:]
