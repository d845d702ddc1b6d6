"""A row's environment tools in its prompt (``reasonrl.envs.prompting``, ``reasonrl.data.prompts.render_prompt``):
with SmolLM2's template (no ``tools``) the search prompt's tokens are byte-identical to the rows that carried the
``describe_tools`` text in their system message; with a ChatML template that reads ``tools`` (Qwen2.5's pattern,
set on a copy of the real SmolLM2 tokenizer) the schemas go through ``tools=`` and the description text does not."""
from __future__ import annotations

import json

import pytest

from reasonrl.data.prompts import PromptDataset, render_prompt
from reasonrl.datasets import search as search_data
from reasonrl.envs.chat import template_supports_tools
from reasonrl.envs.parsers import describe_tools
from reasonrl.envs.prompting import row_tools
from reasonrl.envs.search import SEARCH_TOOLS

QUESTION = "In what year was the city of Valdmere founded?"
DESCRIPTION = "You may call tools. The tools, as JSON schemas:"  # describe_tools' first line
TOOLS_TEMPLATE = (  # ChatML with tools, after Qwen2.5's template: the schemas in the system turn, one per line
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags.<|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


@pytest.fixture(scope="module")
def tools_tokenizer(model_path):
    from reasonrl.models import load_tokenizer

    tok = load_tokenizer(model_path)  # a copy: the module's other tokenizer keeps SmolLM2's template
    tok.chat_template = TOOLS_TEMPLATE
    return tok


def row(system=search_data.SYSTEM):
    return {"prompt": [{"role": "system", "content": system}, {"role": "user", "content": QUESTION}],
            "environment": "search"}


def todays(tokenizer, question=QUESTION):
    """The search prompt as rendered before: the description written into the row's system message."""
    messages = [{"role": "system", "content": search_data.SYSTEM + "\n\n" + describe_tools(SEARCH_TOOLS)},
                {"role": "user", "content": question}]
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(ids["input_ids"] if not isinstance(ids, list) else ids)


def test_the_rows_environment_decides_which_tools_its_prompt_offers():
    assert row_tools(row()) == SEARCH_TOOLS  # the @tool schema is the one the task documented
    for other in ({"environment": "python"}, {"environment": "code_feedback"}, {}, {"environment": None},
                  {"environment": "no_such_env"}):
        assert row_tools(other) == []  # inline formats teach themselves; no environment, or an unknown one


def test_smollm2_has_no_tools_template_and_its_search_prompt_is_byte_identical(tokenizer, tmp_path):
    assert not template_supports_tools(tokenizer)
    expected = todays(tokenizer)
    assert render_prompt(tokenizer, row()["prompt"], tools=row_tools(row())) == expected
    cached = row(search_data.SYSTEM + "\n\n" + describe_tools(SEARCH_TOOLS))  # a row written before: not twice
    assert render_prompt(tokenizer, cached["prompt"], tools=row_tools(cached)) == expected
    rows = search_data.build_rows("train")[:3]  # the task's rows, as the trainer loads them
    path = tmp_path / "search.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [p.token_ids for p in PromptDataset([str(path)], tokenizer, 4096).prompts] == \
        [todays(tokenizer, r["prompt"][-1]["content"]) for r in rows]
    plain = tokenizer.decode(render_prompt(tokenizer, row()["prompt"], False, tools=row_tools(row())))
    assert DESCRIPTION in plain and '"name": "search"' in plain  # no template: the text prompt describes them


def test_a_template_that_reads_tools_gets_the_schemas_and_not_the_description(tools_tokenizer):
    assert template_supports_tools(tools_tokenizer)
    ids = render_prompt(tools_tokenizer, row()["prompt"], tools=row_tools(row()))
    text = tools_tokenizer.decode(ids)
    schema = json.loads(text.split("<tools>\n")[1].split("\n</tools>")[0])
    assert schema == SEARCH_TOOLS[0] and search_data.SYSTEM in text and QUESTION in text
    assert DESCRIPTION not in text and text.count('"name": "search"') == 1
    assert text.endswith("<|im_start|>assistant\n")
    cached = row(search_data.SYSTEM + "\n\n" + describe_tools(SEARCH_TOOLS))  # the description taken out
    assert render_prompt(tools_tokenizer, cached["prompt"], tools=row_tools(cached)) == ids
    bare = tools_tokenizer.decode(render_prompt(tools_tokenizer, row()["prompt"]))
    assert "<tools>" not in bare  # no tools offered: the template's plain system turn
