"""The environment seam with the real SmolLM2 tokenizer and chat template: the hermes call format (malformed calls
of every kind get a short error observation and are counted), tool turns in the template's own markup with no
drift, rows with and without an environment in one batch, and environments that crash or hang ending only their
own trajectory. The model's turns are scripted (tests/env_helpers.py); everything else is the real loop."""
from __future__ import annotations

import json
import threading

import pytest
from env_helpers import ScriptedPolicy, chat_prompt, tool_runs

from reasonrl.config.env_schema import EnvConfig
from reasonrl.envs import Environment, StepResult, ToolCall, register_environment, tool
from reasonrl.envs.parsers import HermesParser, describe_tools
from reasonrl.envs.registry import ENVIRONMENTS, get_environment_class
from reasonrl.rollout import SamplingParams
from reasonrl.rollout.multiturn import ToolRollout

RELEASE = threading.Event()  # what the hanging tool waits for; set at the end of the module


@register_environment("test_calculator")
class Calculator(Environment):
    """Adds integers; gives reward 1 when the sum is 5; ``crash`` raises, ``hang`` blocks until RELEASE."""

    @tool("Add two integers.", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                "required": ["a", "b"]})
    def add(self, a, b):
        return StepResult(str(a + b), reward=float(a + b == 5))

    @tool("Raise an exception.")
    def crash(self):
        raise RuntimeError("the environment broke")

    @tool("Never return.")
    def hang(self):
        RELEASE.wait()
        return "late"


@pytest.fixture(scope="module", autouse=True)
def release_hung_steps():
    yield
    RELEASE.set()


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def loop_for(tokenizer, scripts, **env):
    engine = ScriptedPolicy(tokenizer, {tuple(p): turns for p, turns in scripts.items()})
    cfg = EnvConfig(step_timeout_s=env.pop("step_timeout_s", 30.0), **env)
    return engine, ToolRollout(engine, tokenizer, None, max_turns=4, env_cfg=cfg, default_env=None)


def test_hermes_parser_counts_every_kind_of_malformed_call():
    parser = HermesParser(max_calls_per_turn=8, max_call_chars=1000)
    turn = ("let me see " + call("add", a=1, b=2) + "<tool_call>{not json}</tool_call>"
            + '<tool_call>["add"]</tool_call>' + "<tool_call>" + "x" * 10_000_000 + "</tool_call><tool_call>{")
    parsed = parser.parse(turn)
    assert [c.name for c in parsed.calls] == ["add"] and parsed.calls[0].arguments == {"a": 1, "b": 2}
    assert len(parsed.errors) == 4  # never closed, bad JSON, not an object with a name, too long
    assert any("never closed" in e for e in parsed.errors) and any("not valid JSON" in e for e in parsed.errors)
    assert any("10000000 characters" in e for e in parsed.errors)
    assert all(len(e) < 200 for e in parsed.errors)
    many = parser.parse(call("add", a=1, b=1) * 1000)
    assert len(many.calls) == 8 and len(many.errors) == 1 and "1000 tool calls" in many.errors[0]
    assert not parser.parse("no calls here").any


def test_environment_step_checks_the_tool_and_its_arguments():
    env = Calculator()
    assert [t["function"]["name"] for t in env.reset({}).tools] == ["add", "crash", "hang"]
    assert env.step(ToolCall("add", {"a": 2, "b": 3})) == StepResult("5", reward=1.0)
    for bad, why in ((ToolCall("mul", {}), "unknown tool 'mul'"), (ToolCall("add", {"a": 1}), "missing argument"),
                     (ToolCall("add", {"a": 1, "b": "2"}), "must be of type integer"),
                     (ToolCall("add", {"a": 1, "b": 2, "c": 3}), "unknown argument"),
                     (ToolCall("add", {"a": True, "b": 2}), "must be of type integer")):
        result = env.step(bad)
        assert result.error and why in result.observation
    assert '"name": "add"' in describe_tools(env.tools())


def test_registry_names_the_entry_point_group_for_an_unknown_environment():
    assert get_environment_class("test_calculator") is Calculator and "python" in ENVIRONMENTS
    with pytest.raises(KeyError, match="reasonrl.environments"):
        get_environment_class("no_such_env")
    with pytest.raises(ValueError, match="already registered"):
        register_environment("test_calculator")(type("Other", (Environment,), {}))


def test_tool_turns_use_the_template_markup_with_no_drift_and_plain_rows_mix_in(tokenizer):
    env_prompt, plain_prompt = chat_prompt(tokenizer, "What is 2 + 3?"), chat_prompt(tokenizer, "Say hi.")
    engine, loop = loop_for(tokenizer, {
        tuple(env_prompt): [call("add", a=2, b=3), "So the answer is \\boxed{5}."],
        tuple(plain_prompt): ["hi there"]})
    out = loop.generate([env_prompt, plain_prompt], SamplingParams(n=2, max_new_tokens=200),
                        rows=[{"environment": "test_calculator"}, {}])
    for c in out[0]:
        assert tool_runs(tokenizer, c) == ["\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"]
        assert (c.env, c.turns, c.tool_calls, c.calls_per_tool, c.env_reward, c.env_drift) == \
            ("test_calculator", 2, 1, {"add": 1}, 1.0, 0)
        assert c.text.endswith("\\boxed{5}.") and "<|im_start|>" not in c.text and c.finish_reason == "stop"
        assert [m["role"] for m in c.conversation] == ["assistant", "tool", "assistant"]
        assert c.conversation[1]["content"] == "5" and c.conversation[0]["content"].startswith("<tool_call>")
    for c in out[1]:
        assert (c.env, c.turns, c.tool_calls, sum(c.tool_mask), c.env_drift) == ("", 1, 0, 0, -1)
        assert c.text == "hi there"


def test_malformed_calls_get_short_error_observations_within_the_budget(tokenizer):
    prompt = chat_prompt(tokenizer, "Compute something.")
    huge = '<tool_call>{"name": "add", "arguments": {"a": "' + "x" * 20_000 + '"}}</tool_call>'  # the parser test has 10 MB
    turns = [call("mul", a=1, b=2), call("add", a="x", b=2), "<tool_call>{bad json</tool_call>", huge,
             call("add", a=1, b=1) * 1000, "\\boxed{2}"]
    engine, loop = loop_for(tokenizer, {tuple(prompt): turns}, max_calls_per_turn=8, max_call_chars=4096)
    loop.max_turns = 6
    budget = 40_000  # a thousand calls are ~25k tokens: the model could only write them with a budget this large
    [[c]] = loop.generate([prompt], SamplingParams(n=1, max_new_tokens=budget), rows=[{"environment": "test_calculator"}])
    shown = tool_runs(tokenizer, c)
    assert len(shown) == 5 and all(len(s) < 1500 for s in shown[:4])
    assert "unknown tool 'mul'" in shown[0] and "must be of type integer" in shown[1]
    assert "not valid JSON" in shown[2] and "longer than the limit of 4096" in shown[3]
    assert "1000 tool calls in one turn; only the first 8 ran" in shown[4]
    # malformed: bad JSON, too long, too many (the unknown tool and the wrong argument parsed, then failed)
    assert (c.malformed_calls, c.tool_calls, c.calls_per_tool) == (3, 2 + 8, {"mul": 1, "add": 9})
    assert c.tool_errors == 2 + 3 and c.env_failed == "" and c.finish_reason == "stop" and len(c.token_ids) <= budget


def test_a_crashing_or_hanging_environment_fails_only_its_trajectory(tokenizer):
    crash, hang, fine = (chat_prompt(tokenizer, q) for q in ("crash", "hang", "fine"))
    engine, loop = loop_for(tokenizer, {tuple(crash): [call("crash"), "never"], tuple(hang): [call("hang"), "never"],
                                        tuple(fine): [call("add", a=1, b=4), "\\boxed{5}"]}, step_timeout_s=0.5)
    rows = [{"environment": "test_calculator"}] * 3
    out = loop.generate([crash, hang, fine], SamplingParams(n=1, max_new_tokens=300), rows=rows)
    (c,), (h,), (f,) = out
    assert c.finish_reason == "env_error" and "RuntimeError: the environment broke" in c.env_failed
    assert h.finish_reason == "env_error" and "timed out after 0.5 s" in h.env_failed
    assert c.turns == h.turns == 1 and sum(c.tool_mask) == sum(h.tool_mask) == 0
    assert f.env_failed == "" and f.text.endswith("\\boxed{5}") and f.env_reward == 1.0


def test_an_environment_that_cannot_start_fails_its_rows_after_one_turn(tokenizer):
    prompt = chat_prompt(tokenizer, "Anything.")
    engine, loop = loop_for(tokenizer, {tuple(prompt): ["an answer"]})
    [[c]] = loop.generate([prompt], SamplingParams(n=1, max_new_tokens=50), rows=[{"environment": "no_such_env"}])
    assert c.finish_reason == "env_error" and "no_such_env" in c.env_failed and c.turns == 1
