"""The suite is laid out as the code is (#44 item 6): unit tests by package under tests/unit/<package>/, the
end-to-end runs of the real commands under tests/e2e/, shared helpers only at the top of tests/; no test module
imports another test module or a benchmark script."""

import ast

from paths import REPO, TESTS

# A unit test's folder names what it tests: a subpackage of reasonrl/, a top-level part installed under reasonrl
# (verifiers, sandboxes, datasets), the registry module, or the repository itself (repo/: layout and docs checks).
PARTS = ({p.name for p in (REPO / "reasonrl").iterdir() if p.is_dir() and any(p.glob("*.py"))}
         | {"verifiers", "sandboxes", "datasets", "registry", "repo"})


def _test_modules():
    return sorted(TESTS.rglob("test_*.py"))


def test_no_test_module_sits_at_the_top_of_tests():
    top = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert top == [], f"test modules belong in tests/unit/<package>/ or tests/e2e/, not tests/: {top}"


def test_every_unit_folder_names_a_part_of_the_code():
    folders = {p.relative_to(TESTS / "unit").parts[0] for p in (TESTS / "unit").rglob("test_*.py")}
    assert folders and folders <= PARTS, f"unit test folders that name no package: {sorted(folders - PARTS)}"
    assert not list((TESTS / "unit").glob("test_*.py")), "a unit test sits in tests/unit/ without its package folder"


def test_test_basenames_are_unique():
    # pytest imports rootdir-less test modules by their basename: two test_x.py in two folders would collide.
    names = [p.name for p in _test_modules()]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_no_test_module_imports_another_test_module_or_a_benchmark_script():
    bad = []
    for path in _test_modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.relative_to(TESTS)} imports {n}" for n in names
                    if n.split(".")[0].startswith("test_") or n.split(".")[0] in ("benchmarks", "conftest")]
    assert bad == []


def test_test_modules_find_the_repository_through_paths_py():
    # A module's own depth changes when it moves; tests/paths.py's REPO does not.
    own_file = "Path(" + "__file__)"  # split, so that this module does not match itself
    bad = [str(p.relative_to(TESTS)) for p in _test_modules()
           if own_file + ".resolve().parents[" in p.read_text() or own_file + ".parent.parent" in p.read_text()]
    assert bad == [], f"use `from paths import REPO` in: {bad}"
