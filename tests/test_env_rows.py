"""What a worker's generator does with task=search: ``ToolRollout.from_config`` finds each prompt's dataset row
by the prompt's tokens (rendered as the trainer renders them) and runs it in its environment; the slow test
generates with a tiny random policy and the real SmolLM2 tokenizer on the hf engine (it calls no tool: the wiring
is what is checked)."""
from __future__ import annotations

import pytest
import torch
from helpers import make_tiny_policy

from reasonrl.config import load_config
from reasonrl.data.prompts import PromptDataset
from reasonrl.datasets import task_files
from reasonrl.models import load_tokenizer
from reasonrl.rollout import SamplingParams
from reasonrl.rollout.multiturn import ToolRollout


@pytest.fixture(scope="module")
def search_run(tmp_path_factory, model_path):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("REASONRL_CACHE", str(tmp_path_factory.mktemp("cache")))  # the generated parquet lands there
        cfg, _ = load_config(["task=search", "rollout.engine=hf", "tool.sandbox=bwrap"], cuda_available=False)
        tokenizer = load_tokenizer(model_path)
        data = PromptDataset(task_files("search", "train", None), tokenizer, cfg.data.max_prompt_length)
        yield cfg, tokenizer, data


def test_search_prompts_find_their_rows_by_their_tokens(search_run):
    cfg, tokenizer, data = search_run
    assert len(data) == 800  # no prompt is longer than the CPU profile's max_prompt_length
    rows = ToolRollout.from_config(None, tokenizer, cfg).row_source([data[0].token_ids, data[5].token_ids, [1, 2]])
    assert [r["reward_model"]["ground_truth"] for r in rows[:2]] == \
        [data[0].row["reward_model"]["ground_truth"], data[5].row["reward_model"]["ground_truth"]]
    assert rows[0]["environment"] == "search" and rows[2] == {}


@pytest.mark.slow
def test_search_prompts_run_in_the_search_environment(search_run, tmp_path, model_path):
    from reasonrl.rollout.hf_engine import HFRolloutEngine

    cfg, tokenizer, data = search_run
    engine = HFRolloutEngine.from_pretrained(make_tiny_policy(tmp_path / "policy", model_path), tokenizer,
                                             torch.float32, "cpu")
    loop = ToolRollout.from_config(engine, tokenizer, cfg)
    try:
        out = loop.generate([data[0].token_ids, data[5].token_ids], SamplingParams(n=2, max_new_tokens=8))
        assert [[c.env for c in g] for g in out] == [["search"] * 2] * 2
        assert all(len(c.token_ids) == len(c.tool_mask) <= 8 for g in out for c in g)
    finally:
        loop.close()
