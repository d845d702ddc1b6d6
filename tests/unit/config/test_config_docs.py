"""docs/configuration.md stays in sync with the docstrings in reasonrl/config/schema.py."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

from reasonrl.config import Config, to_dict
from reasonrl.config.docs import DOC_PATH, check, generate_markdown, parse_schema, render_value, schema_source

ANCHOR = '    ray_address: Optional[str] = None\n    """Ray cluster address; None starts a local Ray."""\n'


def _with_new_field(field_text: str) -> str:
    source = schema_source()
    assert ANCHOR in source, "test anchor moved: update ANCHOR to a field of TrainerConfig"
    return source.replace(ANCHOR, ANCHOR + field_text)


def test_check_passes_for_the_repository():
    proc = subprocess.run([sys.executable, "-m", "reasonrl.config.docs", "--check"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr + "\n(run: python -m reasonrl.config.docs)"


def test_check_fails_after_a_new_field(tmp_path):
    source = _with_new_field('    new_knob: int = 3\n    """A simulated new setting."""\n')
    ok, message = check(DOC_PATH, source)
    assert not ok and "out of date" in message and "python -m reasonrl.config.docs" in message
    assert "| `trainer.new_knob` | `int` | `3` | A simulated new setting. |" in generate_markdown(source)

    schema = tmp_path / "schema.py"
    schema.write_text(source)
    proc = subprocess.run([sys.executable, "-m", "reasonrl.config.docs", "--check", "--schema", str(schema)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "out of date" in proc.stderr
    # Regenerating into a copy makes --check pass against that copy.
    out = tmp_path / "configuration.md"
    assert subprocess.run([sys.executable, "-m", "reasonrl.config.docs", "--schema", str(schema), "--out", str(out)],
                          timeout=120).returncode == 0
    assert check(out, source)[0]


def test_a_field_without_docstring_is_rejected():
    source = _with_new_field("    silent_knob: bool = False\n")
    ok, message = check(DOC_PATH, source)
    assert not ok and "TrainerConfig.silent_knob" in message


def test_every_leaf_field_is_documented_with_its_runtime_default():
    classes = parse_schema(schema_source())
    runtime = to_dict(Config())
    documented = {}
    for section in classes["Config"].fields:
        if section.section is None:
            documented[section.name] = section.default
        else:
            for f in classes[section.section].fields:
                if f.section is None:
                    documented[f"{section.name}.{f.name}"] = f.default
                else:  # a section inside a section (actor.lora)
                    for g in classes[f.section].fields:
                        documented[f"{section.name}.{f.name}.{g.name}"] = g.default
    expected = {}
    for section in dataclasses.fields(Config):
        value = runtime[section.name]
        if isinstance(value, dict) and dataclasses.is_dataclass(section.default_factory):
            for k, v in value.items():
                if isinstance(v, dict) and v and all(isinstance(x, str) for x in v) and \
                        dataclasses.is_dataclass(getattr(section.default_factory(), k)):
                    expected.update({f"{section.name}.{k}.{kk}": render_value(vv) for kk, vv in v.items()})
                else:
                    expected[f"{section.name}.{k}"] = render_value(v)
        else:
            expected[section.name] = render_value(value)
    # The AST reading of defaults (constants, lambdas, literals) equals what the dataclasses really hold.
    assert documented == expected
    text = DOC_PATH.read_text()
    for key in expected:
        assert f"| `{key}` |" in text


def test_readme_and_docs_link_only_to_files_in_the_repository():
    """Every markdown link in README.md, docs/ and benchmarks/README.md points at a file or folder of the repo."""
    import re

    root = DOC_PATH.parents[1]
    pages = [root / "README.md", root / "benchmarks" / "README.md", *sorted((root / "docs").glob("*.md"))]
    assert len(pages) > 10
    problems = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path = target.split("#")[0]
            if "://" in target or target.startswith("mailto:"):
                problems.append(f"{page.relative_to(root)} links out of the repository: {target}")
            elif path and not (page.parent / path).exists():
                problems.append(f"{page.relative_to(root)} links to a missing file: {target}")
            elif path and not (page.parent / path).resolve().is_relative_to(root.resolve()):
                problems.append(f"{page.relative_to(root)} links outside the repository: {target}")
    assert not problems, "\n".join(problems)
    docs = DOC_PATH.parent
    # The algorithm section anchor used by algorithms.md exists in the generated reference.
    assert "## `algorithm`" in (docs / "configuration.md").read_text()
