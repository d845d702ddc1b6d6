"""Generate docs/configuration.md from the config dataclasses: ``python -m reasonrl.config.docs [--check]``.

Each field's description is the string literal written right after it in schema.py; the source is parsed with
``ast`` (docstrings after attributes do not survive at run time). ``--check`` exits 1 when the file on disk
differs from what would be generated, or when a field has no docstring.
"""
from __future__ import annotations

import argparse
import ast
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import presets

SCHEMA_PATHS = (Path(__file__).with_name("schema.py"), Path(__file__).with_name("algorithm_schema.py"),
                Path(__file__).with_name("env_schema.py"),
                Path(__file__).with_name("lora_schema.py"), Path(__file__).with_name("async_schema.py"),
                Path(__file__).with_name("rollout_schema.py"))
"""The modules whose dataclasses are the config (parsed as one source)."""


def schema_source(paths: Sequence[Path] = SCHEMA_PATHS) -> str:
    """The config modules' source, joined: what ``parse_schema`` reads."""
    return "\n".join(Path(p).read_text(encoding="utf-8") for p in paths)
DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
ROOT_CLASS = "Config"


@dataclass
class FieldDoc:
    """One config field as read from the source."""

    name: str
    type: str
    default: str
    doc: Optional[str]
    section: Optional[str] = None  # the dataclass name when the field is a nested section


@dataclass
class ClassDoc:
    name: str
    doc: Optional[str]
    fields: List[FieldDoc]


class UndocumentedFields(ValueError):
    """Fields without a docstring (every config field must have one)."""


def _constants(tree: ast.Module) -> Dict[str, Any]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


def render_value(value: Any) -> str:
    """A value as written on the command line (OmegaConf/YAML spelling): true, null, [0.9, 0.999], {}."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(render_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {render_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _default(node: Optional[ast.expr], constants: Dict[str, Any], classes: Sequence[str]) -> Tuple[str, Optional[str]]:
    """(rendered default, nested section class or None)."""
    if node is None:
        return "(required)", None
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "field":
        for kw in node.keywords:
            if kw.arg == "default_factory":
                if isinstance(kw.value, ast.Name) and kw.value.id in classes:
                    return "", kw.value.id
                if isinstance(kw.value, ast.Lambda):
                    return _default(kw.value.body, constants, classes)
                if isinstance(kw.value, ast.Name) and kw.value.id in ("list", "dict"):
                    return ("[]" if kw.value.id == "list" else "{}"), None
            if kw.arg == "default":
                return _default(kw.value, constants, classes)
        return ast.unparse(node), None
    if isinstance(node, ast.Name) and node.id in constants:
        return render_value(constants[node.id]), None
    try:
        return render_value(ast.literal_eval(node)), None
    except ValueError:
        return ast.unparse(node), None


def _clean(doc: str) -> str:
    return " ".join(inspect.cleandoc(doc).split())


def parse_schema(source: str) -> Dict[str, ClassDoc]:
    """Every class in the source with its fields, types, defaults and field docstrings, in source order."""
    tree = ast.parse(source)
    constants = _constants(tree)
    class_nodes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    names = [c.name for c in class_nodes]
    classes: Dict[str, ClassDoc] = {}
    for cls in class_nodes:
        fields: List[FieldDoc] = []
        body = cls.body
        for i, stmt in enumerate(body):
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            nxt = body[i + 1] if i + 1 < len(body) else None
            doc = None
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                doc = _clean(nxt.value.value)
            default, section = _default(stmt.value, constants, names)
            fields.append(FieldDoc(stmt.target.id, ast.unparse(stmt.annotation), default, doc, section))
        cls_doc = ast.get_docstring(cls)
        classes[cls.name] = ClassDoc(cls.name, _clean(cls_doc) if cls_doc else None, fields)
    return classes


def undocumented(classes: Dict[str, ClassDoc]) -> List[str]:
    """``Class.field`` names of leaf fields that lack a docstring."""
    return [f"{c.name}.{f.name}" for c in classes.values() for f in c.fields if f.doc is None and f.section is None]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(fields: List[FieldDoc], prefix: str) -> List[str]:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for f in fields:
        if f.section is None:
            default = f"`{_cell(f.default)}`" if f.default else ""
            lines.append(f"| `{prefix}{f.name}` | `{_cell(f.type)}` | {default} | {_cell(f.doc or '')} |")
    return lines


def _flatten(d: Dict[str, Any], prefix: str = "") -> List[str]:
    out = []
    for key, value in d.items():
        if isinstance(value, dict) and value:
            out += _flatten(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={render_value(value)}")
    return out


def _preset_section() -> List[str]:
    lines = ["## Presets", "",
             "Layers, later wins: schema defaults, then the task preset (`task=...`), then the algorithm preset",
             "(`algorithm=...`), then the size profile (`trainer.profile`: cpu is applied when there is no GPU; laptop",
             "when asked for), then",
             "the mode preset (`trainer.mode`), then your own `key=value` arguments.", "",
             "| task | sets |", "|---|---|"]
    lines += [f"| `{name}` | {_cell(', '.join(f'`{kv}`' for kv in _flatten(p)))} |"
              for name, p in presets.TASK_PRESETS.items()]
    lines += ["", "| algorithm | sets (under `algorithm.`) |", "|---|---|"]
    lines += [f"| `{name}` | {_cell(', '.join(f'`{kv}`' for kv in _flatten(p)))} |"
              for name, p in presets.ALGORITHM_PRESETS.items()]
    ceilings = ", ".join(f"`{section}.{key}`" for section, key in presets.PROFILE_LENGTH_CEILINGS)
    lines += ["", "CPU profile: " + ", ".join(f"`{kv}`" for kv in _flatten(presets.CPU_PROFILE))
              + f" ({ceilings} only shorten a task's own; a task that sets `data.max_prompt_length` keeps it: its "
              "prompts need it)", "",
              "Laptop profile (`trainer.profile=laptop`): "
              + ", ".join(f"`{kv}`" for kv in _flatten(presets.LAPTOP_PROFILE)),
              ""]
    lines += [f"Mode `{name}`: " + ", ".join(f"`{kv}`" for kv in _flatten(p)) for name, p in presets.MODE_PRESETS.items()]
    lines += [""]
    return lines


def generate_markdown(source: Optional[str] = None) -> str:
    """The whole configuration reference. Raises UndocumentedFields when a field has no docstring."""
    classes = parse_schema(source if source is not None else schema_source())
    missing = undocumented(classes)
    if missing:
        raise UndocumentedFields("config fields without a docstring (add a string literal after each): "
                                 + ", ".join(missing))
    root = classes[ROOT_CLASS]
    lines = ["# Configuration reference", "",
             "<!-- Generated by `python -m reasonrl.config.docs` from the docstrings in reasonrl/config/schema.py, algorithm_schema.py and lora_schema.py.",
             "     Do not edit by hand: change the docstring and regenerate (tests/unit/config/test_config_docs.py checks). -->",
             "",
             "Every setting is a `key=value` argument, e.g.",
             "",
             "```bash",
             "python -m reasonrl.train task=gsm8k algorithm=grpo rollout.n=8 actor.lr=1e-6 "
             "trainer.logger=[console,jsonl,tensorboard]",
             "```",
             "",
             "Values use OmegaConf syntax: `true`/`false`, `null`, lists as `[a,b]`. An unknown key or a value of the",
             "wrong type is an error that names the key, before anything loads.",
             ""]
    lines += _preset_section()
    top = [f for f in root.fields if f.section is None]
    if top:
        lines += ["## Top level", ""] + _table(top, "") + [""]
    for f in root.fields:
        if f.section is None:
            continue
        section = classes[f.section]
        lines += [f"## `{f.name}`", ""]
        if f.doc or section.doc:
            lines += [f.doc or section.doc, ""]
        lines += _table(section.fields, f"{f.name}.") + [""]
        for sub in (g for g in section.fields if g.section is not None):  # a section inside a section (actor.lora)
            lines += [f"### `{f.name}.{sub.name}`", ""]
            if sub.doc or classes[sub.section].doc:
                lines += [sub.doc or classes[sub.section].doc, ""]
            lines += _table(classes[sub.section].fields, f"{f.name}.{sub.name}.") + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def check(doc_path: Path = DOC_PATH, source: Optional[str] = None) -> Tuple[bool, str]:
    """(in sync, message)."""
    try:
        expected = generate_markdown(source)
    except UndocumentedFields as exc:
        return False, str(exc)
    if not doc_path.is_file():
        return False, f"{doc_path} does not exist; run: python -m reasonrl.config.docs"
    if doc_path.read_text(encoding="utf-8") != expected:
        return False, f"{doc_path} is out of date with reasonrl/config/schema.py; run: python -m reasonrl.config.docs"
    return True, f"{doc_path} is up to date"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reasonrl.config.docs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from the generated text")
    parser.add_argument("--out", type=Path, default=DOC_PATH, help=f"output file (default {DOC_PATH})")
    parser.add_argument("--schema", type=Path, nargs="+", default=list(SCHEMA_PATHS),
                        help="the config modules to read (default: schema.py and algorithm_schema.py)")
    args = parser.parse_args(argv)
    source = schema_source(args.schema)
    if args.check:
        ok, message = check(args.out, source)
        print(message, file=sys.stdout if ok else sys.stderr)
        return 0 if ok else 1
    try:
        text = generate_markdown(source)
    except UndocumentedFields as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
