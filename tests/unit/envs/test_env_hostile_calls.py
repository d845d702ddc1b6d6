"""Hostile model output in the hermes format costs its own trajectory an error observation, never the batch: a call
nested thousands of brackets deep (``json`` would recurse past the interpreter's limit), a tool argument holding lone
UTF-16 surrogates (the tokenizer refuses them), and a turn of tens of thousands of unclosed ``<tool_call>`` tags
(found in one pass, not one scan per tag). The real SmolLM2 tokenizer and chat template; scripted model turns."""
from __future__ import annotations

import json
import time

import pytest
from env_helpers import ScriptedPolicy, chat_prompt, tool_runs

from reasonrl.config.env_schema import EnvConfig
from reasonrl.envs import Environment, StepResult, register_environment, tool
from reasonrl.envs.parsers import MAX_JSON_DEPTH, HermesParser, call_bodies, json_depth
from reasonrl.rollout import SamplingParams
from reasonrl.rollout.multiturn import ToolRollout

ECHO_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


@register_environment("test_echo")
class Echo(Environment):
    """Answers with the text it was given, as a search or lookup tool quotes its query back."""

    @tool("Repeat the text.", ECHO_SCHEMA)
    def echo(self, text):
        return StepResult(f"you said: {text}", reward=1.0)

    @tool("Fail, quoting the text.", ECHO_SCHEMA)
    def boom(self, text):
        raise RuntimeError(f"cannot take {text}")


def deep_call(levels: int) -> str:
    """A call whose argument is ``levels`` nested arrays: a few kilobytes of brackets."""
    return ('<tool_call>{"name": "echo", "arguments": {"text": ' + "[" * levels + "]" * levels + "}}</tool_call>")


# ---------------------------------------------------------------------------------------------- the parser
def test_deep_nesting_is_refused_before_decoding_and_shallow_calls_still_parse():
    parser = HermesParser(max_calls_per_turn=8, max_call_chars=16_384)
    parsed = parser.parse(deep_call(5000))  # 10,000 brackets: json.loads alone raises RecursionError
    assert parsed.calls == [] and len(parsed.errors) == 1
    assert f"nested 5002 levels deep, more than {MAX_JSON_DEPTH}" in parsed.errors[0]
    args_as_string = json.dumps({"name": "echo", "arguments": "[" * 4000 + "]" * 4000})
    assert "not a JSON object" in parser.parse(f"<tool_call>{args_as_string}</tool_call>").errors[0]
    ok = parser.parse('<tool_call>{"name": "echo", "arguments": {"text": "[[{{ in a string }}]]", "n": [[1]]}}'
                      "</tool_call>")
    assert ok.errors == [] and ok.calls[0].arguments == {"text": "[[{{ in a string }}]]", "n": [[1]]}
    # brackets inside strings, and escaped quotes before them, do not count: {"a": "\"[[["} is one level
    assert json_depth('{"a": "\\"[[[", "b": [{"c": "]]]"}]}') == 3


class CountingText(str):
    """A turn's text that counts the characters its ``find`` calls read (from where a search starts to where it
    stops): the parser's work, independent of how busy the machine is."""

    read = 0

    def find(self, sub, start=0, end=None):
        at = str.find(self, sub, start)
        CountingText.read += (len(self) if at < 0 else at + len(sub)) - start
        return at


def characters_read(text: str) -> int:
    CountingText.read = 0
    call_bodies(CountingText(text), 8)
    return CountingText.read


@pytest.mark.parametrize("closed_first", [0, 500])
def test_finding_calls_reads_the_turn_once_however_many_tags_stay_open(closed_first):
    prefix = '<tool_call>{"name": "echo", "arguments": {"text": "x"}}</tool_call>' * closed_first

    def turn(tags: int) -> str:
        return prefix + "<tool_call>" * tags

    small, large = characters_read(turn(8_000)), characters_read(turn(80_000))
    # one pass reads each character about once; a scan from every open tag would read ~n^2/2 (8,000 tags: ~350 M)
    assert small <= 2 * len(turn(8_000)) and large <= 2 * len(turn(80_000))
    assert large / small < 20  # ten times the tags, about ten times the work (quadratic: a hundred)
    text, start = turn(80_000), time.monotonic()
    parsed = HermesParser().parse(text)
    assert time.monotonic() - start < 5.0  # quadratic took 8.3 s at 8,000 tags; one pass takes milliseconds
    assert any("never closed" in e for e in parsed.errors)
    assert len(parsed.calls) == min(closed_first, 8) and (closed_first <= 8 or "500 tool calls" in parsed.errors[1])


# ---------------------------------------------------------------------------------------------- the loop
def test_one_hostile_trajectory_gets_an_error_turn_and_the_batch_completes(tokenizer):
    with pytest.raises(TypeError):  # what reached the tokenizer before: a lone surrogate it cannot encode
        tokenizer("you said: \ud800", add_special_tokens=False)
    deep, lone, fine, crash = (chat_prompt(tokenizer, q) for q in ("Nest.", "Escape.", "Echo hi.", "Crash."))
    surrogates = '<tool_call>{"name": "echo", "arguments": {"text": "a\\ud800b\\udfff"}}</tool_call>'
    hi = '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'
    engine = ScriptedPolicy(tokenizer, {tuple(deep): [deep_call(3000), "\\boxed{1}"],
                                        tuple(lone): [surrogates, "\\boxed{2}"],
                                        tuple(fine): [hi, "\\boxed{3}"],
                                        tuple(crash): [surrogates.replace("echo", "boom"), "never"]})
    loop = ToolRollout(engine, tokenizer, None, max_turns=3, env_cfg=EnvConfig(max_call_chars=8192),
                       default_env="test_echo")
    out = loop.generate([deep, lone, fine, crash], SamplingParams(n=2, max_new_tokens=4000))
    for c in out[3]:  # an environment that raises, quoting the call: a recorded failure that any log can encode
        assert c.finish_reason == "env_error" and "RuntimeError: cannot take a\ufffdb\ufffd" in c.env_failed
        c.env_failed.encode("utf-8")
    for d, s, f in zip(*out[:3]):
        for c in (d, s, f):
            assert c.env_failed == "" and c.finish_reason == "stop" and c.turns == 2 and c.env_drift == 0
        assert "nested 3002 levels deep" in tool_runs(tokenizer, d)[0] and d.malformed_calls == 1
        assert (d.tool_calls, d.text[-9:]) == (0, "\\boxed{1}")
        assert "you said: a\ufffdb\ufffd" in tool_runs(tokenizer, s)[0] and s.conversation[1]["content"] == \
            "you said: a\ufffdb\ufffd"
        assert (s.tool_calls, s.env_reward, s.text[-9:]) == (1, 1.0, "\\boxed{2}")
        assert tool_runs(tokenizer, f) == ["\n<|im_start|>tool\nyou said: hi<|im_end|>\n<|im_start|>assistant\n"]
        assert (f.tool_calls, f.env_reward, f.text[-9:]) == (1, 1.0, "\\boxed{3}")


def test_a_tool_turn_that_cannot_be_tokenized_fails_only_its_trajectory(tokenizer):
    """The last line of defence: whatever breaks while a trajectory's answer becomes tokens (here a tokenizer that
    refuses one text) is that trajectory's recorded failure; the others finish."""

    class Refusing:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def __call__(self, text, **kwargs):
            if "poison" in text:
                raise TypeError("TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, ...]]")
            return self.inner(text, **kwargs)

    bad, good = chat_prompt(tokenizer, "Bad."), chat_prompt(tokenizer, "Good.")
    call = '<tool_call>{"name": "echo", "arguments": {"text": "%s"}}</tool_call>'
    engine = ScriptedPolicy(tokenizer, {tuple(bad): [call % "poison", "never"], tuple(good): [call % "ok", "done"]})
    loop = ToolRollout(engine, Refusing(tokenizer), None, max_turns=3, env_cfg=EnvConfig(), default_env="test_echo")
    (b,), (g,) = loop.generate([bad, good], SamplingParams(n=1, max_new_tokens=300))
    assert b.finish_reason == "env_error" and "TypeError" in b.env_failed and sum(b.tool_mask) == 0
    assert g.env_failed == "" and g.text.endswith("done") and g.tool_calls == 1
