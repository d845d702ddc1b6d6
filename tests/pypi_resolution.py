"""The gpu extra's pip dry run against PyPI (tests/unit/doctor/test_install_pins.py), started in the background as
soon as collection shows that its test will run, so that its minute or two of network waits overlaps the suite's
CPU-bound tests instead of adding to them; the test then waits for the finished run (fixture
``gpu_extra_resolution``). A pytest plugin of conftest.py. The dry run reads each wheel's metadata with HTTP range
requests (pip's fast-deps) and writes a few kilobytes: a JSON report and pip's stderr."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional, Tuple

import pytest

TEST_NAME = "test_the_gpu_extra_resolves_on_pypi_for_the_gpu_machine"
PYPI = "https://pypi.org/simple"
RESOLVE_TIMEOUT_S = 900  # a full resolution of ~200 packages' metadata took 36-130 s on the 2-core machine
PLATFORMS = [f"manylinux_2_{m}_x86_64" for m in range(17, 36)] + ["manylinux2014_x86_64"]
"""The GPU machine's platform tags (pip matches a wheel against any of them)."""


def pip_env() -> dict:
    """This environment's pip settings without the machine's local wheel folders and constraints: PyPI only."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") or k in ("PIP_CERT", "PIP_CLIENT_CERT", "PIP_PROXY", "PIP_TRUSTED_HOST")}
    env["PIP_CONFIG_FILE"] = os.devnull  # no pip.conf: its find-links / extra indexes are not PyPI
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def resolution_command(requirements: List[str], report: Path, target: Path) -> List[str]:
    """pip's dry run of ``requirements`` for CPython 3.12 on the GPU machine's platform, binary wheels from PyPI only,
    its choices in ``report``; ``target`` must stay unwritten."""
    return [sys.executable, "-m", "pip", "install", "--use-feature=fast-deps", "--dry-run", "--ignore-installed",
            "--quiet", "--report", str(report), "--index-url", PYPI, "--only-binary=:all:", "--implementation", "cp",
            "--python-version", "3.12", "--target", str(target), *[a for p in PLATFORMS for a in ("--platform", p)],
            *requirements]


class Resolution:
    """One background dry run of the pyproject's dependencies plus its gpu extra, in a folder of its own."""

    def __init__(self) -> None:
        from paths import REPO

        try:
            import tomllib
        except ImportError:  # Python 3.10
            import tomli as tomllib
        project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
        self.requirements = list(project["dependencies"]) + list(project["optional-dependencies"]["gpu"])
        self.folder = Path(tempfile.mkdtemp(prefix="reasonrl-gpu-extra-"))
        self.report, self.target = self.folder / "report.json", self.folder / "never-written"
        self._stderr = open(self.folder / "stderr.txt", "w+")
        self.proc = subprocess.Popen(resolution_command(self.requirements, self.report, self.target),
                                     stdout=subprocess.DEVNULL, stderr=self._stderr, env=pip_env())

    def wait(self, timeout_s: float = RESOLVE_TIMEOUT_S) -> Tuple[Optional[int], str]:
        """pip's exit status (None when it ran past ``timeout_s``, and then it is killed) and its stderr."""
        try:
            code: Optional[int] = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        self._stderr.seek(0)
        return code, self._stderr.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()
        shutil.rmtree(self.folder, ignore_errors=True)


_started: List[Resolution] = []  # the session's one background run, once collection selected the test


@pytest.hookimpl(trylast=True)  # after deselection (-m "not network", -k ...)
def pytest_collection_modifyitems(session, config, items):
    if not _started and any(item.originalname == TEST_NAME for item in items):
        _started.append(Resolution())


def pytest_unconfigure(config):
    while _started:
        _started.pop().close()


@pytest.fixture
def gpu_extra_resolution() -> Resolution:
    """The session's background dry run (started now if collection did not start it)."""
    if not _started:
        _started.append(Resolution())
    return _started[0]
