"""examples/env_plugin is a real pip-installable environment plugin found through the ``reasonrl.environments``
entry point: installed (``pip install --no-deps --no-build-isolation --target``) from a copy of the example, then
found by name in a fresh interpreter and stepped there; and run through the multi-turn loop in this process with
the real tokenizer (turns scripted)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from env_helpers import ScriptedPolicy, chat_prompt, tool_runs
from paths import REPO

EXAMPLE = REPO / "examples" / "env_plugin"


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("env_plugin")
    source = root / "src"
    shutil.copytree(EXAMPLE, source)
    target = root / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--disable-pip-version-check", "--target", str(target), str(source)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [entry_points] = target.glob("reasonrl_kv_env-*.dist-info/entry_points.txt")
    assert "kv_store = reasonrl_kv_env:KeyValueEnvironment" in entry_points.read_text()
    return target


def test_a_fresh_interpreter_finds_and_steps_the_installed_environment(installed_plugin):
    code = ("from reasonrl.envs import EnvContext, ToolCall, available_environments, make_environment\n"
            "env = make_environment('kv_store', EnvContext())\n"
            "tools = env.reset({'extra_info': {'store': {'a': '1'}, 'goal': {'b': '1'}}}).tools\n"
            "print('kv_store' in available_environments(), [t['function']['name'] for t in tools])\n"
            "print(env.step(ToolCall('get', {'key': 'a'})).observation)\n"
            "r = env.step(ToolCall('put', {'key': 'b', 'value': '1'})); print(r.reward, r.done)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(installed_plugin)] + sys.path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:3] == ["True ['get', 'put']", "1", "1.0 True"]


def test_the_loop_runs_the_plugin_to_its_goal(installed_plugin, monkeypatch, model_path):
    monkeypatch.syspath_prepend(str(installed_plugin))
    from reasonrl.envs import registry
    from reasonrl.models import load_tokenizer
    from reasonrl.rollout import SamplingParams
    from reasonrl.rollout.multiturn import ToolRollout

    registry.ENVIRONMENTS.rescan_entry_points()  # read the entry points again, plugin included
    tokenizer = load_tokenizer(model_path)
    prompt = chat_prompt(tokenizer, "Copy a into b.")
    call = lambda name, **a: f"<tool_call>{json.dumps({'name': name, 'arguments': a})}</tool_call>"  # noqa: E731
    engine = ScriptedPolicy(tokenizer, {tuple(prompt): [call("get", key="a"), call("put", key="b", value="7")]})
    row = {"environment": "kv_store", "extra_info": {"store": {"a": "7"}, "goal": {"b": "7"}}}
    [[c]] = ToolRollout(engine, tokenizer, None, max_turns=4, default_env=None).generate(
        [prompt], SamplingParams(n=1, max_new_tokens=300), rows=[row])
    assert tool_runs(tokenizer, c) == ["\n<|im_start|>tool\n7<|im_end|>\n<|im_start|>assistant\n"]
    assert (c.env, c.calls_per_tool, c.env_reward, c.turns, c.env_drift) == ("kv_store", {"get": 1, "put": 1}, 1.0,
                                                                             2, 0)
