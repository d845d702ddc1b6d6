"""task=search_hops: search's rows with all three worked examples in chat turns, the third a two-hop question
answered with two calls."""
from __future__ import annotations

from reasonrl.config.load import load_config
from reasonrl.config.tasks import TASKS
from reasonrl.data.prompts import render_prompt
from reasonrl.datasets import search, search_example, search_hops
from reasonrl.datasets.common import recipe
from reasonrl.envs.prompting import row_tools


def test_rows_are_searchs_with_the_three_examples_between_the_system_message_and_the_question():
    plain, shown = search.build_rows("test"), search_hops.build_rows("test")
    assert recipe("search_hops") is search_hops and search_hops.SHOWN == 3
    assert len(shown) == len(plain) == 200
    for a, b in zip(plain, shown):
        assert b["prompt"] == [a["prompt"][0], *search_example.EXAMPLE, *search_example.CITY_EXAMPLE,
                               *search_example.HOP_EXAMPLE, a["prompt"][-1]]
        assert {k: v for k, v in a.items() if k != "prompt"} == {k: v for k, v in b.items() if k != "prompt"}
    # 1 system + 4 + 4 + 6 example turns + the question; the third example's two calls before its answer
    assert [m["role"] for m in shown[0]["prompt"][9:]] == [
        "user", "assistant", "tool", "assistant", "tool", "assistant", "user"]


def test_the_task_runs_the_search_environment_and_every_prompt_fits_its_prompt_length(tokenizer):
    """The prompts run to about 634 tokens, past search_examples' 448: the task sets 656."""
    cfg, notes = load_config(["task=search_hops"], cuda_available=False)
    assert (cfg.tool.enabled, cfg.env.default, cfg.rollout.max_turns) == (True, "search", 4)
    assert notes["profile"] == "cpu" and cfg.data.max_prompt_length == TASKS["search_hops"].prompt_tokens == 656
    rows = [r for split in ("train", "test") for r in search_hops.build_rows(split)]
    lengths = [len(render_prompt(tokenizer, r["prompt"], tools=row_tools(r))) for r in rows]
    assert 600 < max(lengths) <= 656
    text = tokenizer.decode(render_prompt(tokenizer, rows[0]["prompt"], tools=row_tools(rows[0])))
    assert text.count("<|im_start|>tool") == 4  # one, one and two tool turns
    assert text.index(search_example.HOP_ARTICLES[1]) < text.index(rows[0]["prompt"][-1]["content"])
