"""reasonrl/controller/mps.py: what a run with ``async_rollout.share_devices`` does about NVIDIA's MPS daemon. No GPU
and no daemon here, so ``decide`` is checked case by case, and ``prepare_shared_gpu`` against a stand-in
``nvidia-cuda-mps-control`` on PATH that records how it is called (started with ``-d`` before the workers; told
``quit`` when the process exits, through atexit)."""
from __future__ import annotations

import os
import stat

import pytest

from reasonrl.config import ConfigError
from reasonrl.controller import mps
from reasonrl.controller.mps import (actor_client_env, daemon_running, decide, prepare_shared_gpu, refused_hint,
                                     shared_gpu_envs)

BIN = "/usr/bin/nvidia-cuda-mps-control"


def test_decide_case_by_case():
    # not a shared GPU, or disabled: nothing, whatever else holds
    assert decide("auto", shared_gpu=False, local_cluster=True, control=BIN, running=False).action == "none"
    assert decide("required", shared_gpu=False, local_cluster=True, control=None, running=False).error == ""
    assert decide("disabled", shared_gpu=True, local_cluster=True, control=BIN, running=False) == mps.Decision("none")
    # a daemon runs: use it (auto and required alike), never start a second
    for mode in ("auto", "required"):
        assert decide(mode, True, True, BIN, running=True).action == "use"
    # none runs, the binary is there, a local cluster: start it
    started = decide("auto", True, True, BIN, running=False)
    assert started.action == "start" and "starting nvidia-cuda-mps-control" in started.note
    # none can be started: auto says the GPU is time-sliced and how to silence it; required refuses, naming why
    no_binary = decide("auto", True, True, None, running=False)
    assert (no_binary.action, no_binary.error) == ("none", "")
    assert "nvidia-cuda-mps-control is not on PATH" in no_binary.note and "time-slicing" in no_binary.note
    assert "async_rollout.mps=disabled silences this" in no_binary.note
    refused = decide("required", True, True, None, running=False)
    assert refused.error.startswith("async_rollout.mps=required: no MPS daemon runs") and "not on PATH" in refused.error
    remote = decide("required", True, local_cluster=False, control=BIN, running=False)
    assert "trainer.ray_address" in remote.error  # a cluster's machines start their own daemons


def test_a_daemon_is_seen_when_it_answers(tmp_path, monkeypatch):
    log = stand_in(tmp_path, monkeypatch)
    control = str(tmp_path / "nvidia-cuda-mps-control")
    assert not daemon_running(control)  # the stand-in exits 1 while no daemon is marked up
    (tmp_path / "up").touch()
    assert daemon_running(control)
    assert log.read_text().splitlines() == ["args:", "get_server_list", "args:", "get_server_list"]
    assert not daemon_running(None)  # no binary: no daemon to use
    assert mps.pipe_directory({}) == "/tmp/nvidia-mps"  # NVIDIA's default


def stand_in(tmp_path, monkeypatch):
    log = tmp_path / "calls.log"
    control = tmp_path / "nvidia-cuda-mps-control"
    # records its arguments and stdin; a query (no -d) answers 0 only while tmp_path/up marks a daemon up
    control.write_text(f'#!/bin/sh\necho "args:$*" >> {log}\ncat >> {log}\n'
                       f'[ "$1" = "-d" ] && exit 0\n[ -f {tmp_path}/up ] && exit 0\n'
                       f'grep -q quit {log} && exit 0\nexit 1\n')
    control.chmod(control.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "pipe"))
    monkeypatch.setenv("CUDA_MPS_LOG_DIRECTORY", str(tmp_path / "log"))
    return log


def test_prepare_starts_the_daemon_and_quits_it_at_exit(tmp_path, monkeypatch, capsys):
    log = stand_in(tmp_path, monkeypatch)
    at_exit = []
    monkeypatch.setattr(mps.atexit, "register", lambda fn, *args: at_exit.append((fn, args)))
    decision = prepare_shared_gpu("auto", shared_gpu=True, local_cluster=True)
    assert decision.action == "start"
    assert log.read_text().splitlines() == ["args:", "get_server_list", "args:-d"]  # none answered: started
    assert "reasonrl: MPS: starting nvidia-cuda-mps-control" in capsys.readouterr().out
    assert [fn for fn, _ in at_exit] == [mps.quit_daemon]
    fn, args = at_exit[0]
    fn(*args)  # what the process does at exit
    assert mps.QUITTERS[-1].wait(timeout=30) == 0
    assert log.read_text().splitlines() == ["args:", "get_server_list", "args:-d", "args:", "quit"]


def test_prepare_uses_a_running_daemon_and_refuses_required_without_one(tmp_path, monkeypatch, capsys):
    log = stand_in(tmp_path, monkeypatch)
    (tmp_path / "up").touch()  # a daemon runs
    assert prepare_shared_gpu("required", shared_gpu=True, local_cluster=True).action == "use"
    assert log.read_text().splitlines() == ["args:", "get_server_list"]  # asked; nothing started, nothing to quit
    assert "a daemon runs already" in capsys.readouterr().out
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="async_rollout.mps=required: no MPS daemon runs .*not on PATH"):
        prepare_shared_gpu("required", shared_gpu=True, local_cluster=True)


def test_the_trainers_client_limits_are_set_only_where_they_differ_from_mps_defaults():
    assert actor_client_env(100, "normal") == {}  # all the SMs, normal priority: MPS's defaults, nothing to set
    assert actor_client_env(60, "normal") == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "60"}
    assert actor_client_env(100, "below_normal") == {"CUDA_MPS_CLIENT_PRIORITY": "1"}  # NVIDIA's BELOW_NORMAL
    assert actor_client_env(1, "below_normal") == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "1",
                                                   "CUDA_MPS_CLIENT_PRIORITY": "1"}


def test_only_the_trainers_processes_get_the_limits_and_only_on_a_shared_gpu():
    alloc = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    actor, replica = shared_gpu_envs(True, "cuda", 50, "below_normal", {})
    assert actor == {**alloc, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50", "CUDA_MPS_CLIENT_PRIORITY": "1"}
    assert replica == alloc  # the replicas keep every SM and normal priority
    # the user's allocator setting wins (nothing of ours), the limits still go to the trainer
    actor, replica = shared_gpu_envs(True, "cuda", 50, "normal", {"PYTORCH_CUDA_ALLOC_CONF": "x"})
    assert (actor, replica) == ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}, {})
    # no shared GPU (separate pools, or a CPU run): nothing for anyone
    assert shared_gpu_envs(False, "cuda", 50, "below_normal", {}) == ({}, {})
    assert shared_gpu_envs(True, "cpu", 50, "below_normal", {}) == ({}, {})


def test_limits_without_a_daemon_are_named_as_doing_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no control binary: auto goes on time-sliced
    limits = actor_client_env(60, "below_normal")
    assert prepare_shared_gpu("auto", shared_gpu=True, local_cluster=True, actor_env=limits).action == "none"
    out = capsys.readouterr().out
    assert ("MPS: no daemon, so the trainer's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_CLIENT_PRIORITY does "
            "nothing") in out
    prepare_shared_gpu("auto", shared_gpu=True, local_cluster=True, actor_env={})
    assert "does nothing" not in capsys.readouterr().out  # no limits asked for: nothing to say
    prepare_shared_gpu("auto", shared_gpu=True, local_cluster=False, actor_env=limits)
    assert "does nothing" not in capsys.readouterr().out  # a joined cluster's machines may run daemons that read them


def test_a_worker_the_mps_daemon_refused_is_told_what_to_do(monkeypatch):
    from reasonrl.controller.worker_group import failure_message

    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)  # NVIDIA's default folder

    refused = ("RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
               "calling NumCudaDevices() that might have already set an error? Error 805: MPS client failed to "
               "connect to the MPS control daemon or the MPS server")  # the thirtieth session's H100, verbatim
    message = failure_message("BenchWorker", 0, "init_model", refused)
    assert message.startswith(f"BenchWorker rank 0 failed while init_model: {refused} (the MPS daemon on "
                              "/tmp/nvidia-mps refused this process.")
    assert "echo quit | nvidia-cuda-mps-control" in message
    # the pipe directory is the one the process would look in
    assert "on /srv/mps refused" in refused_hint(refused, {"CUDA_MPS_PIPE_DIRECTORY": "/srv/mps"})
    # any other failure is reported as it was
    assert failure_message("RolloutWorker", 1, "generating", "CUDA out of memory") == (
        "RolloutWorker rank 1 failed while generating: CUDA out of memory")
