"""task=search_examples: search's rows with the first SHOWN (2) worked examples of the tool in chat turns."""
from __future__ import annotations

import hashlib
import inspect
import re
from pathlib import Path

import pytest

from reasonrl.config.load import load_config
from reasonrl.config.tasks import TASKS
from reasonrl.data.prompts import render_prompt
from reasonrl.datasets import search, search_example, search_examples
from reasonrl.datasets.common import recipe, source_digest
from reasonrl.envs.parsers import HermesParser
from reasonrl.envs.prompting import row_tools
from reasonrl.envs.search import CorpusIndex


def test_rows_are_searchs_with_two_examples_between_the_system_message_and_the_question():
    plain, shown = search.build_rows("test"), search_examples.build_rows("test")
    assert recipe("search_examples") is search_examples and search_examples.SHOWN == 2
    assert len(shown) == len(plain) == 200
    for a, b in zip(plain, shown):
        assert b["prompt"] == [a["prompt"][0], *search_example.EXAMPLE, *search_example.CITY_EXAMPLE,
                               a["prompt"][-1]]
        assert {k: v for k, v in a.items() if k != "prompt"} == {k: v for k, v in b.items() if k != "prompt"}
    assert [m["role"] for m in shown[0]["prompt"]] == [
        "system", "user", "assistant", "tool", "assistant", "user", "assistant", "tool", "assistant", "user"]
    assert shown[0]["prompt"][5]["content"] == "In what year was the city of Qualdor founded?"
    # task=search_example still shows the first example alone; three is the most there are
    assert search_example.build_rows("test")[0]["prompt"][1:-1] == search_example.EXAMPLE
    assert len(search_example.shown_turns(3)) == 4 + 4 + 6
    with pytest.raises(ValueError, match="1..3"):
        search_example.shown_turns(4)


@pytest.mark.parametrize("example,queries,year", [
    (search_example.EXAMPLE, ["Zorbel Quintax"], "1834"),
    (search_example.CITY_EXAMPLE, ["Qualdor"], "1612"),
    (search_example.HOP_EXAMPLE, ["Mippa Trondle", "Hoskarn"], "1255"),
])
def test_each_example_calls_search_by_name_and_ends_with_the_year_its_tool_turn_gave(example, queries, year):
    calls = [c for m in example if m["role"] == "assistant" and "<tool_call>" in m["content"]
             for c in HermesParser().parse(m["content"]).calls]
    assert [(c.name, c.arguments) for c in calls] == [("search", {"query": q}) for q in queries]
    assert example[0]["role"] == "user" and example[-1]["role"] == "assistant"
    assert re.findall(r"\\boxed\{(\d+)\}", example[-1]["content"]) == [year]
    assert f"in the year {year}" in example[-2]["content"]  # the last tool turn holds the year


def _from_syllables(word: str) -> bool:
    """Whether ``word`` (lower case) is a run of search.SYLLABLES, as every corpus name is."""
    return word == "" or any(word.startswith(s) and _from_syllables(word[len(s):]) for s in search.SYLLABLES)


def test_no_example_name_can_be_in_the_corpus():
    assert _from_syllables("valdor") and not _from_syllables("qualdor")  # the check itself, by hand
    docs = search.build_corpus()
    index = CorpusIndex(docs)
    try:
        for name in search_example.NAMES:
            assert not any(_from_syllables(w.lower()) for w in name.split()), name
            assert all(name not in d["text"] for d in docs)
            assert all(h["title"] != name for h in index.search(name))
    finally:
        index.close()


def test_the_cache_digest_reads_search_example_too():
    """search_examples' rows change when search_example.py's examples do, so its digest covers both sources."""
    both = b"".join(Path(inspect.getsourcefile(m)).read_bytes() for m in (search_examples, search_example))
    assert source_digest("search_examples") == hashlib.sha256(both).hexdigest()
    assert source_digest("search_example") == hashlib.sha256(
        Path(inspect.getsourcefile(search_example)).read_bytes()).hexdigest()


def test_task_preset_runs_the_search_environment_and_the_prompt_shows_both_examples(tokenizer):
    cfg, _ = load_config(["task=search_examples"], cuda_available=False)
    assert (cfg.tool.enabled, cfg.env.default, cfg.rollout.max_turns) == (True, "search", 4)
    assert TASKS["search_examples"].recipe == "search_examples"
    row = search_examples.build_rows("train")[0]
    text = tokenizer.decode(render_prompt(tokenizer, row["prompt"], tools=row_tools(row)))
    # the schema in the system message once, one call per example; two tool turns; examples before the question
    assert text.count('"name": "search"') == 3 and text.count("<|im_start|>tool") == 2
    assert text.index(search_example.EXAMPLE_ARTICLE) < text.index(search_example.CITY_ARTICLE) \
        < text.index(row["prompt"][-1]["content"])
    assert text.rstrip().endswith("<|im_start|>assistant")


def test_every_prompt_fits_the_task_prompt_length_which_the_cpu_profile_keeps(tokenizer):
    """The prompts run to about 430 tokens: the CPU profile's 384 would drop every one, so the task sets 448."""
    cfg, notes = load_config(["task=search_examples"], cuda_available=False)
    assert notes["profile"] == "cpu" and cfg.data.max_prompt_length == TASKS["search_examples"].prompt_tokens == 448
    assert load_config(["task=search_example"], cuda_available=False)[0].data.max_prompt_length == 384  # unchanged
    assert load_config(["task=search_examples", "data.max_prompt_length=500"],
                       cuda_available=False)[0].data.max_prompt_length == 500  # the user's value wins
    lengths = [len(render_prompt(tokenizer, r["prompt"], tools=row_tools(r)))
               for split in ("train", "test") for r in search_examples.build_rows(split)]
    assert 384 < max(lengths) <= 448
