"""The REPL client (verifiers/lean_repl.py) against tests/lean_repl_standin.py — a STAND-IN that speaks the
leanprover-community REPL's JSON protocol; it is not Lean. Covers replies, messages and severities, sorries,
environment reuse and branching, refused requests, debug noise, timeouts, crashes, the memory cap, restarts."""
from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from components import needs
from paths import TESTS

from reasonrl.verifiers.lean_repl import (LeanRepl, ReplConfig, ReplCrashed, ReplError, ReplNotFound,
                                          ReplOutOfMemory, ReplPool, ReplTimeout, _process_tree, bwrap_repl_command,
                                          describe, messages_of, shared_pool)

STANDIN = str(TESTS / "lean_repl_standin.py")
HEADER = "import Mathlib\nopen Real\n"


def standin(*flags: str) -> tuple:
    return (sys.executable, STANDIN, *flags)


@pytest.fixture
def repls():
    made = []

    def make(*flags: str, **config) -> LeanRepl:
        repl = LeanRepl(ReplConfig(command=standin(*flags), **config))
        made.append(repl)
        return repl

    yield make
    for repl in made:
        repl.close()


def test_reply_fields_messages_and_severities(repls):
    repl = repls()
    env0 = repl.header_env(HEADER, timeout_s=30)
    assert env0 == 0  # the first command of a fresh process gets env 0
    ok = repl.run("theorem t (a : ℕ) : a = a := by\n  rfl", env0, timeout_s=30)
    assert ok == {"env": 1}  # empty message/sorry lists are left out, as the REPL does
    bad = repl.run("theorem u : 1 = 2 := by\n  exact bogus", env0, timeout_s=30)
    assert bad["env"] == 2
    [err] = messages_of(bad, "error")
    assert messages_of(bad, "warning") == []
    assert describe(err) == "2:2: unknown identifier 'bogus'"  # line 1 + 1, column 2, as the stand-in reports


def test_sorries_are_reported_with_their_goal(repls):
    repl = repls()
    env0 = repl.header_env(HEADER, timeout_s=30)
    reply = repl.run("theorem s (x : ℕ) : x + 0 = x := by\n  sorry", env0, timeout_s=30)
    [warning] = messages_of(reply, "warning")
    assert warning["data"] == "declaration uses 'sorry'"
    assert len(reply["sorries"]) == 1 and reply["sorries"][0]["goal"] == "⊢ x + 0 = x"


def test_header_env_is_built_once_and_branches_are_independent(repls, tmp_path):
    log = tmp_path / "requests.log"
    repl = repls("--log", str(log))
    env0 = repl.header_env(HEADER, timeout_s=30)
    assert repl.header_env(HEADER, timeout_s=30) == env0  # cached: no second import
    a = repl.run("theorem same : 1 = 1 := by\n  rfl", env0, timeout_s=30)
    b = repl.run("theorem same : 1 = 1 := by\n  rfl", env0, timeout_s=30)
    # Both branch from env0, so the second declaration is not "already declared".
    assert messages_of(a) == [] and messages_of(b) == []
    c = repl.run("theorem same : 2 = 2 := by\n  rfl", a["env"], timeout_s=30)
    assert "already been declared" in messages_of(c, "error")[0]["data"]
    lines = log.read_text().splitlines()
    assert sum('"env"' not in line for line in lines) == 1  # one request without env: the header import
    assert len(lines) == 4  # header + three commands


def test_unknown_environment_is_a_refused_request(repls):
    repl = repls()
    reply = repl.request({"cmd": "theorem t : 1 = 1 := by rfl", "env": 99}, timeout_s=30)
    assert reply == {"message": "Unknown environment."}


def test_header_that_does_not_elaborate_raises_a_clear_error(repls):
    repl = repls()
    with pytest.raises(ReplError, match="header does not elaborate.*unknown module prefix 'NoSuchLib'"):
        repl.header_env("import NoSuchLib\n", timeout_s=30)


def test_debug_noise_before_replies_is_skipped(repls):
    # --noise prints "Processing incremental state ..." lines holding a blank line and a '{' line before
    # every reply, like some REPL builds; the client must still find each reply.
    repl = repls("--noise")
    env0 = repl.header_env(HEADER, timeout_s=30)
    reply = repl.run("theorem t : 1 = 1 := by\n  rfl\n\n-- {not json}", env0, timeout_s=30)
    assert reply == {"env": 1}
    assert repl.noise and repl.noise[0].startswith("Processing incremental state")


def test_timeout_kills_the_repl_and_the_next_request_restarts_it(repls):
    repl = repls()
    env0 = repl.header_env(HEADER, timeout_s=30)
    first_pid = repl.proc.pid
    start = time.monotonic()
    with pytest.raises(ReplTimeout, match="timed out after 1s"):
        repl.run("theorem t : 1 = 1 := by\n  loop_forever", env0, timeout_s=1)
    assert time.monotonic() - start < 15  # it did return (the bound is loose on purpose: not a timing test)
    assert not repl.alive and repl.header_envs == {}
    assert not os.path.exists(f"/proc/{first_pid}") or _zombie(first_pid)
    env0 = repl.header_env(HEADER, timeout_s=30)  # a fresh process, header rebuilt
    assert repl.proc.pid != first_pid and env0 == 0 and repl.starts == 2
    assert repl.run("theorem t : 1 = 1 := by\n  rfl", env0, timeout_s=30) == {"env": 1}


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_crash_is_reported_with_stderr_and_recovered(repls):
    repl = repls()
    env0 = repl.header_env(HEADER, timeout_s=30)
    with pytest.raises(ReplCrashed, match=r"exit code 3.*INTERNAL PANIC"):
        repl.run("theorem t : 1 = 1 := by\n  crash_now", env0, timeout_s=30)
    env0 = repl.header_env(HEADER, timeout_s=30)
    assert repl.run("theorem t : 1 = 1 := by\n  rfl", env0, timeout_s=30) == {"env": 1}


def test_memory_cap_kills_the_repl(repls):
    # The stand-in holds ~400 MiB on `eat_memory`; the cap is 150 MiB (a Python interpreter uses ~10-20).
    repl = repls(memory_mb=150, poll_s=0.05)
    env0 = repl.header_env(HEADER, timeout_s=30)
    with pytest.raises(ReplOutOfMemory, match="memory cap"):
        repl.run("theorem t : 1 = 1 := by\n  eat_memory", env0, timeout_s=60)
    assert not repl.alive


def test_restart_after_max_commands(repls):
    repl = repls(max_commands=3)
    env0 = repl.header_env(HEADER, timeout_s=30)  # request 1
    repl.run("theorem a : 1 = 1 := by rfl", env0, timeout_s=30)  # 2
    pid = repl.proc.pid
    repl.run("theorem b : 1 = 1 := by rfl", env0, timeout_s=30)  # 3
    assert repl.proc.pid == pid
    env0 = repl.header_env(HEADER, timeout_s=30)  # 4th request: the limit of 3 was reached -> fresh process
    assert repl.proc.pid != pid and env0 == 0


def test_missing_executable_raises_not_found():
    repl = LeanRepl(ReplConfig(command=("/nonexistent/repl",)))
    with pytest.raises(ReplNotFound, match="no Lean REPL found"):
        repl.request({"cmd": ""}, timeout_s=5)


def test_pool_reuses_a_warm_repl_and_shares_it_per_process():
    config = ReplConfig(command=standin())
    pool = ReplPool(config, size=2)
    try:
        repl = pool.acquire(HEADER)
        repl.header_env(HEADER, timeout_s=30)
        pool.release(repl)
        assert pool.acquire(HEADER) is repl  # the idle REPL that holds the header comes back
        pool.release(repl)
        assert shared_pool(config) is shared_pool(ReplConfig(command=standin()))  # same key, same pool
    finally:
        pool.close()


def test_process_tree_lists_descendants(repls):
    repl = repls()
    repl.start()
    assert _process_tree(repl.proc.pid)[0] == repl.proc.pid


@pytest.mark.bwrap
@needs("bubblewrap", shutil.which("bwrap") is not None, "bwrap is not on PATH (run .ci/setup_sandboxes.sh)")
def test_repl_runs_inside_bubblewrap(repls, tmp_path):
    venv_root = Path(sys.executable).resolve().parents[1]
    command = bwrap_repl_command(standin(), ro_paths=[str(Path(STANDIN).parent), str(venv_root),
                                                      str(Path(sys.executable).parent.parent)])
    repl = LeanRepl(ReplConfig(command=tuple(command)))
    try:
        env0 = repl.header_env(HEADER, timeout_s=60)
        assert repl.run("theorem t : 1 = 1 := by\n  rfl", env0, timeout_s=30) == {"env": 1}
        with pytest.raises(ReplTimeout):
            repl.run("theorem t : 1 = 1 := by\n  loop_forever", env0, timeout_s=1)
        assert not repl.alive
    finally:
        repl.close()


def _hold_a_repl(queue) -> None:
    repl = LeanRepl(ReplConfig(command=standin()))
    repl.header_env(HEADER, timeout_s=30)
    queue.put(repl.proc.pid)
    # Busy REPL: it will not notice its stdin closing, so only the parent-death signal can end it.
    repl.run("theorem t : 1 = 1 := by\n  loop_forever", repl.header_env(HEADER, timeout_s=30), timeout_s=120)


def test_repl_dies_with_a_worker_that_is_killed():
    # A VerifierPool kills a worker that passes its timeout; the worker's REPL must not outlive it.
    import multiprocessing
    import select
    import signal

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    worker = ctx.Process(target=_hold_a_repl, args=(queue,))
    worker.start()
    try:
        repl_pid = queue.get(timeout=60)
        assert not _zombie(repl_pid)  # running while the worker lives
        exited = os.pidfd_open(repl_pid)  # readable once the REPL has exited: an event, not a clock
        try:
            os.kill(worker.pid, signal.SIGKILL)
            worker.join(timeout=30)
            readable, _, _ = select.select([exited], [], [], 300)  # the bound only guards against a hang
        finally:
            os.close(exited)
        assert readable and _zombie(repl_pid), "the REPL outlived its worker"
    finally:
        if worker.is_alive():
            worker.kill()
