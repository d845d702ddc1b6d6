"""Stopping a run the way schedulers do: SIGTERM to the whole process group (``timeout``, a terminal's job, Slurm's
``scancel`` of a step) while a step is in flight.

The real CLI on Ray with the hf engine and conftest's ``tiny_policy``. The step is held in flight at an exact place:
``REASONRL_FAULT_AT=group.update_actor#1=pause`` stops the driver in step 1's actor update (the workers have the
call) until the test creates the release file, so the signal lands mid-step with nothing left to timing. Ray's own
processes run in a session of their own (``reasonrl/controller/ray_head.py``): the group's signal must not reach
them, and none of them may outlive the run.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ARGS = ["task=gsm8k", "rollout.engine=hf", "data.train_batch_size=2", "rollout.n=2", "rollout.max_new_tokens=8",
        "actor.micro_batch_size_per_worker=4", "reward.workers=1", "trainer.logger=[jsonl]", "trainer.num_workers=1",
        "trainer.total_steps=2", "trainer.save_every=0"]
PAUSED = "fault point group.update_actor#1: pause"
FIRST_SIGNAL = "reasonrl: SIGTERM: finishing the step in flight"


def ray_heads_of(pid: int) -> set:
    """The pids of ``pid``'s children that run ``ray start --head`` leading a session of their own."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if int(fields[1]) == pid and int(fields[3]) == int(entry.name) and "start --head" in command:
                found.add(int(entry.name))  # ppid, session id
    return found


def alive_in_session(sid: int) -> list:
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                alive.append(stat[:120])
    return alive


class Run:
    """The CLI in a process group of its own, its output read line by line as it comes."""

    def __init__(self, out: Path, policy: str) -> None:
        self.release = out.parent / "release"
        env = dict(os.environ, OMP_NUM_THREADS="1", REASONRL_FAULT_AT="group.update_actor#1=pause",
                   REASONRL_FAULT_RELEASE=str(self.release))
        self.proc = subprocess.Popen([sys.executable, "-m", "reasonrl.train", *ARGS, f"model.path={policy}",
                                      f"trainer.output_dir={out}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, start_new_session=True)
        self.lines: list = []

    def wait_for(self, text: str) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if text in line:
                return
        raise AssertionError(f"the run ended before printing {text!r}:\n" + "".join(self.lines[-60:]))

    def finish(self) -> str:
        self.lines += list(self.proc.stdout)
        self.proc.wait(timeout=300)
        return "".join(self.lines)


def signal_group_mid_step(out: Path, policy: str, second_signal: bool):
    """(exit status, output, seconds from the first signal to the exit, the Ray head's session)."""
    run = Run(out, policy)
    try:
        run.wait_for(PAUSED)
        heads = ray_heads_of(run.proc.pid)
        assert len(heads) == 1, heads  # ``ray start --head`` in a session of its own
        signalled = time.monotonic()
        os.killpg(run.proc.pid, signal.SIGTERM)
        run.wait_for(FIRST_SIGNAL)  # the handler has run: the step is asked to stop at its end
        if second_signal:
            os.killpg(run.proc.pid, signal.SIGTERM)
        run.release.touch()
        output = run.finish()
        return run.proc.returncode, output, time.monotonic() - signalled, heads.pop()
    finally:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)


@pytest.mark.timeout(900)
def test_sigterm_to_the_group_mid_step_saves_the_step_and_exits_130(tmp_path, tiny_policy):
    from reasonrl.trainer.checkpoint import read_trainer_state, verify_checkpoint

    out = tmp_path / "run"
    status, output, seconds, head = signal_group_mid_step(out, tiny_policy, second_signal=False)
    print(f"SIGTERM to the group -> exit in {seconds:.1f} s")
    assert status == 130, output[-6000:]
    assert f"reasonrl: interrupted — step 1 saved in {out / 'checkpoints'}" in output, output[-6000:]
    assert "Traceback" not in output and "Failed to connect to GCS" not in output, output[-6000:]
    ckpt = out / "checkpoints" / "step_000001"
    verify_checkpoint(ckpt)  # every file against its manifest
    assert read_trainer_state(ckpt)["step"] == 1
    assert not (out / "checkpoints" / "step_000002").exists()
    assert alive_in_session(head) == []  # no Ray process outlived the run


@pytest.mark.timeout(900)
def test_second_sigterm_aborts_and_names_the_real_resume_point(tmp_path, tiny_policy):
    out = tmp_path / "run"
    status, output, seconds, head = signal_group_mid_step(out, tiny_policy, second_signal=True)
    print(f"two SIGTERMs to the group -> exit in {seconds:.1f} s")
    assert status == 130, output[-6000:]
    assert (f"reasonrl: aborted without saving the step in flight; no checkpoint exists in {out / 'checkpoints'}; "
            f"running the same command again starts at step 1 from model.path") in output, output[-6000:]
    assert "interrupted — step" not in output, output[-6000:]
    assert not list((out / "checkpoints").glob("step_*")) if (out / "checkpoints").exists() else True
    assert alive_in_session(head) == []
