"""task=math_tool's config and data, the tool settings' validation, and the hf engine's stop-string cut."""
from __future__ import annotations

import pytest

from reasonrl.config import load_config
from reasonrl.config.load import ConfigError
from reasonrl.tools.python import SYSTEM_PROMPT


def test_math_tool_preset_turns_tools_on_and_bad_tool_settings_are_refused():
    cfg, _ = load_config(["task=math_tool"], cuda_available=False)
    assert cfg.tool.enabled and cfg.tool.name == "python" and cfg.rollout.max_turns == 4
    assert cfg.reward.verifier is None  # rows choose their verifier (the math_tool rows carry "math")
    plain, _ = load_config(["task=gsm8k"], cuda_available=False)
    assert not plain.tool.enabled
    with pytest.raises(ConfigError, match="tool.sandbox"):
        load_config(["task=math_tool", "tool.sandbox=subprocess"], cuda_available=False)  # never unsandboxed
    with pytest.raises(ConfigError, match="rollout.max_turns"):
        load_config(["task=math_tool", "rollout.max_turns=0"], cuda_available=False)
    with pytest.raises(ConfigError, match="tool.timeout_s"):
        load_config(["tool.timeout_s=0"], cuda_available=False)


def test_math_tool_rows_carry_the_tool_system_prompt(data_dir):
    from reasonrl.datasets import math_tool

    rows = math_tool.build_rows("test", data_dir)
    sources = {r["data_source"] for r in rows}
    assert sources == {"openai/gsm8k", "math500"}  # GSM8K test and MATH-500, each scored by its own rows' answers
    for r in (rows[0], rows[-1]):
        assert r["prompt"][0] == {"role": "system", "content": SYSTEM_PROMPT}
        assert [m["role"] for m in r["prompt"]] == ["system", "user"] and r["verifier"] == "math"
    with pytest.raises(ValueError, match="splits"):
        math_tool.build_rows("valid", data_dir)


def test_hf_stop_string_cut_keeps_the_token_that_completes_it(model_path):
    from reasonrl.models import load_tokenizer
    from reasonrl.rollout.hf_engine import first_stop_string_end

    tok = load_tokenizer(model_path)
    ids = tok.encode("```python\nprint(1)\n```\n\nThe answer", add_special_tokens=False)
    cut = first_stop_string_end(tok, ids, ["```\n"])
    assert tok.decode(ids[:cut]).endswith("```\n") or tok.decode(ids[:cut]).endswith("```\n\n")
    assert "print(1)" in tok.decode(ids[:cut]) and "answer" not in tok.decode(ids[:cut])
    assert first_stop_string_end(tok, ids[:cut - 1], ["```\n"]) is None  # the opening ```python is no stop


def tools_import_graph(folder):
    """{module: the package's modules it imports, "__init__" for the package face}, for reasonrl/tools/*.py."""
    import ast

    modules = {p.stem for p in folder.glob("*.py")} - {"__init__"}
    graph = {}
    for name in modules:
        found = set()
        for node in ast.walk(ast.parse((folder / f"{name}.py").read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            module = node.module or ""
            if node.level == 0:  # absolute: only reasonrl.tools[.x] counts
                if module != "reasonrl.tools" and not module.startswith("reasonrl.tools."):
                    continue
                module = module[len("reasonrl.tools."):] if module != "reasonrl.tools" else ""
            if module:
                found.add(module.split(".")[0])
            else:  # from . import x / from reasonrl.tools import x: a module, or a name of the face
                found |= {a.name if a.name in modules else "__init__" for a in node.names}
        graph[name] = found
    return graph


def test_tool_modules_import_no_circle_and_make_tool_names_a_bad_tool():
    from pathlib import Path

    import reasonrl.tools as tools
    from reasonrl.config.schema import ToolConfig

    graph = tools_import_graph(Path(tools.__file__).parent)
    assert "__init__" not in set().union(*graph.values()), graph  # no module imports the package face back

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, seen + (n,))) for n in graph.get(start, ()))

    assert not [m for m in graph if reaches(m, m)], graph  # e.g. base -> python -> base before
    assert "registry" in graph["python"] and "python" not in graph["registry"] | graph["base"]
    assert tools.make_tool.__module__ == "reasonrl.tools" and "python" in tools.TOOLS
    with pytest.raises(ValueError, match=r"unknown tool 'calculator' \(tool.name\); known: python"):
        tools.make_tool(ToolConfig(name="calculator"))
