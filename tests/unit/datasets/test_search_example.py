"""task=search_example: search's rows with one worked example of the tool in chat turns before the question."""
from __future__ import annotations

from reasonrl.config.load import load_config
from reasonrl.data.prompts import render_prompt
from reasonrl.datasets import search, search_example
from reasonrl.datasets.common import recipe
from reasonrl.envs.parsers import HermesParser
from reasonrl.envs.prompting import row_tools
from reasonrl.envs.search import CorpusIndex


def test_rows_are_searchs_with_the_example_turns_before_the_question():
    plain, shown = search.build_rows("test"), search_example.build_rows("test")
    assert recipe("search_example") is search_example and len(shown) == len(plain) == 200
    for a, b in zip(plain, shown):
        assert b["prompt"] == [a["prompt"][0], *search_example.EXAMPLE, a["prompt"][-1]]
        assert {k: v for k, v in a.items() if k != "prompt"} == {k: v for k, v in b.items() if k != "prompt"}
    assert [m["role"] for m in shown[0]["prompt"]] == ["system", "user", "assistant", "tool", "assistant", "user"]


def test_the_example_call_parses_and_names_nobody_in_the_corpus():
    turn = HermesParser().parse(search_example.EXAMPLE[1]["content"])
    assert not turn.errors and [(c.name, c.arguments) for c in turn.calls] == [
        ("search", {"query": search_example.EXAMPLE_NAME})]
    docs = search.build_corpus()
    assert all(search_example.EXAMPLE_NAME not in d["text"] for d in docs)
    index = CorpusIndex(docs)  # its search finds no document titled with the example's name (no answer given away)
    try:
        assert all(h["title"] != search_example.EXAMPLE_NAME for h in index.search(search_example.EXAMPLE_NAME))
    finally:
        index.close()


def test_task_preset_runs_the_search_environment_and_the_prompt_offers_its_tool(tokenizer):
    cfg, _ = load_config(["task=search_example"], cuda_available=False)
    assert (cfg.tool.enabled, cfg.env.default, cfg.rollout.max_turns) == (True, "search", 4)
    row = search_example.build_rows("train")[0]
    text = tokenizer.decode(render_prompt(tokenizer, row["prompt"], tools=row_tools(row)))
    # the schema in the system message once, the example's call once; the example's turns, then the question's
    assert text.count('"name": "search"') == 2 and text.count("<|im_start|>tool") == 1
    assert text.index(search_example.EXAMPLE_ARTICLE) < text.index(row["prompt"][-1]["content"])
    assert text.rstrip().endswith("<|im_start|>assistant")
