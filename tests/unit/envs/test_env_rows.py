"""The dataset rows reach the environments with the prompts: the trainer's prompt batch carries each prompt's row
(meta ``rows``, ``trainer.streaming.prompt_batch``), the worker's engine host hands them to the tool loop, and each
trajectory's environment is reset with its own row. Two rows with the same prompt and different answers (which a
lookup by the prompt's tokens cannot tell apart) each get theirs, also split across engines as the worker group
splits a batch. The model's turns are scripted (tests/env_helpers.py); the tokenizer, the rendering, the data file,
the engine host and the loop are real. The slow test generates with a tiny random policy on the hf engine
(task=search: it calls no tool, the wiring is what is checked)."""
from __future__ import annotations

import json

import pytest
import torch
from helpers import make_tiny_policy

from reasonrl.config import load_config
from reasonrl.data.prompts import PromptDataset
from reasonrl.datasets import task_files
from reasonrl.envs import Environment, StepResult, register_environment, tool
from reasonrl.models import load_tokenizer
from reasonrl.rollout.base import Completion
from reasonrl.trainer.streaming import prompt_batch
from reasonrl.workers.engine_host import EngineHost


@register_environment("test_row_secret")
class RowSecret(Environment):
    """``secret()`` answers the row's ``extra_info.secret`` and rewards the row's ``extra_info.reward``."""

    @tool("Tell the secret.")
    def secret(self):
        info = self.row["extra_info"]
        return StepResult(str(info["secret"]), reward=float(info["reward"]))


class CallThenAnswer:
    """A scripted model: a ``secret`` call while the context holds no tool turn, then a final answer."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.tool_turn = tokenizer.encode("<|im_start|>tool", add_special_tokens=False)

    def generate(self, prompts, sampling):
        out = []
        for context in prompts:
            told = any(context[i:i + len(self.tool_turn)] == self.tool_turn for i in range(len(context)))
            text = "\\boxed{done}" if told else '<tool_call>{"name": "secret", "arguments": {}}</tool_call>'
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            out.append([Completion(ids, text, [-0.5] * len(ids), "stop") for _ in range(sampling.n)])
        return out


def same_prompt_rows(tmp_path, secrets):
    """A data file of rows with one prompt and different environment answers."""
    path = tmp_path / "same_prompt.jsonl"
    prompt = [{"role": "user", "content": "What is the secret? Ask the tool."}]
    with open(path, "w") as f:
        for i, secret in enumerate(secrets):
            f.write(json.dumps({"data_source": "test", "prompt": prompt, "ability": "test",
                                "environment": "test_row_secret",
                                "reward_model": {"style": "rule", "ground_truth": secret},
                                "extra_info": {"secret": secret, "reward": i / 10}}) + "\n")
    return str(path)


def test_rows_with_the_same_prompt_each_reach_their_own_environment(tmp_path, tokenizer):
    secrets = ["alpha", "bravo", "charlie", "delta"]
    files = same_prompt_rows(tmp_path, secrets)
    cfg, _ = load_config(["task=search", "rollout.engine=hf", f"data.train_files=[{files}]", "env.default=none"],
                         cuda_available=False)
    prompts = list(PromptDataset([files], tokenizer, cfg.data.max_prompt_length))
    assert len({tuple(p.token_ids) for p in prompts}) == 1  # one prompt: its tokens cannot tell the rows apart
    batch = prompt_batch(prompts)
    host = EngineHost(CallThenAnswer(tokenizer), tokenizer, cfg, "cpu", tools=True)
    try:
        for parts in (1, 2):  # one engine, or two engines each with its part of the batch (WorkerGroup's split)
            sampling = {"n": 2, "max_new_tokens": 100}
            out = [s for part in batch.chunk(parts) for chunk in host.generate_chunks(part, sampling, 1) for s in chunk]
            told = [s.env.conversation[1]["content"] for s in out]
            assert told == [s for s in secrets for _ in range(2)]
            assert [s.env.reward for s in out] == [i / 10 for i in range(4) for _ in range(2)]
            assert all(s.env.failed == "" for s in out)
            assert [s.group for s in out] == [i for i in range(4) for _ in range(2)]  # the round's, over the parts
    finally:
        host.generator.close()


def test_a_batch_without_rows_runs_the_default_environment(tokenizer, tmp_path):
    cfg, _ = load_config(["task=search", "rollout.engine=hf", "env.default=none"], cuda_available=False)
    host = EngineHost(CallThenAnswer(tokenizer), tokenizer, cfg, "cpu", tools=True)
    from reasonrl.data.batch import Batch

    prompt = tokenizer.encode("hello", add_special_tokens=False)
    [[sample]] = list(host.generate_chunks(Batch(meta={"prompt_ids": [prompt]}), {"n": 1, "max_new_tokens": 50}, 0))
    assert sample.env.name == "" and sample.tools.turns == 1  # env.default=none: a plain prompt, one model turn
    assert sample.group == 0  # a batch without group ids numbers its prompts from 0


@pytest.fixture(scope="module")
def search_run(tmp_path_factory, model_path):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("REASONRL_CACHE", str(tmp_path_factory.mktemp("cache")))  # the generated parquet lands there
        cfg, _ = load_config(["task=search", "rollout.engine=hf", "tool.sandbox=bwrap"], cuda_available=False)
        tokenizer = load_tokenizer(model_path)
        data = PromptDataset(task_files("search", "train", None), tokenizer, cfg.data.max_prompt_length)
        yield cfg, tokenizer, data


@pytest.mark.slow
def test_search_prompts_run_in_the_search_environment(search_run, tmp_path, model_path):
    from reasonrl.rollout.hf_engine import HFRolloutEngine

    cfg, tokenizer, data = search_run
    assert len(data) == 800  # no prompt is longer than the CPU profile's max_prompt_length
    engine = HFRolloutEngine.from_pretrained(make_tiny_policy(tmp_path / "policy", model_path), tokenizer,
                                             torch.float32, "cpu")
    host = EngineHost(engine, tokenizer, cfg, "cpu", tools=True)
    try:
        [out] = list(host.generate_chunks(prompt_batch([data[0], data[5]]), {"n": 2, "max_new_tokens": 8}, 0))
        assert [s.env.name for s in out] == ["search"] * 4
        assert all(len(s.response_ids) == len(s.tool_mask) <= 8 for s in out)
    finally:
        host.generator.close()
