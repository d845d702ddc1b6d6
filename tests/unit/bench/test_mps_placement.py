"""reasonrl/bench/mps.py: the MPS daemon around the same-GPU benchmark. The daemon cannot run here (no GPU), so a
stand-in ``nvidia-cuda-mps-control`` on PATH records how it is called: started with ``-d`` before the block, told
``quit`` after it, also when the block fails."""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile

import pytest

from reasonrl.controller import mps
from reasonrl.bench.mps import gpu_placement


def test_without_mps_nothing_starts_and_the_placement_is_time_slicing(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no control binary at all: not needed
    with gpu_placement(False, on_gpu=False) as placement:
        assert placement == "time-slicing"


def test_mps_is_refused_naming_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="nvidia-cuda-mps-control: not found"):
        with gpu_placement(True, on_gpu=True):
            pass
    with pytest.raises(RuntimeError, match="GPU: False"):
        with gpu_placement(True, on_gpu=False):
            pass


@pytest.mark.parametrize("fails", [False, True])
def test_the_daemon_starts_before_the_block_and_quits_after_it(monkeypatch, tmp_path, fails):
    log = tmp_path / "calls.log"
    control = tmp_path / "nvidia-cuda-mps-control"
    control.write_text(f'#!/bin/sh\necho "args:$*" >> {log}\necho "log:$CUDA_MPS_LOG_DIRECTORY" >> {log}\n'
                       f'cat >> {log}\n')  # its log folder and its stdin too
    control.chmod(control.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the default log folder goes under it
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "pipe"))
    monkeypatch.delenv("CUDA_MPS_LOG_DIRECTORY", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir reads TMPDIR again
    seen = []
    with pytest.raises(ValueError) if fails else contextlib.nullcontext():
        with gpu_placement(True, on_gpu=True) as placement:
            seen.append((placement, log.read_text()))
            if fails:
                raise ValueError("the benchmark failed")
    assert mps.QUITTERS[-1].wait(timeout=30) == 0  # quit is sent without waiting for the daemon to end
    assert seen[0][0] == "mps"
    logs = tmp_path / "reasonrl-mps-log"
    assert seen[0][1].splitlines() == ["args:-d", f"log:{logs}"]  # up before the block ran, its log under /tmp
    assert logs.is_dir() and (tmp_path / "pipe").is_dir()
    # the quitter inherits this process's environment (no log folder set in it)
    assert log.read_text().splitlines() == ["args:-d", f"log:{logs}", "args:", "log:", "quit"]


def test_a_processs_mps_client_variables_are_read_from_its_environment():
    from reasonrl.bench.mps import mps_client_env

    environ = {"CUDA_MPS_CLIENT_PRIORITY": "1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "60", "CUDA_VISIBLE_DEVICES": "0",
               "PATH": "/bin"}
    assert mps_client_env(None, environ) == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "60", "CUDA_MPS_CLIENT_PRIORITY": "1"}
    assert mps_client_env(None, {"PATH": "/bin"}) == {}
