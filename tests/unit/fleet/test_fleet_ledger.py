"""reasonrl/fleet/ledger.py: one state per prompt, late answers dropped by attempt, and a journal that a crash at any
byte neither loses nor duplicates: replayed from every prefix of a recorded journal, and from real processes killed
with SIGKILL (one mid-way through writing a line)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from reasonrl.fleet.ledger import DONE, FAILED, ISSUED, PENDING, RESUME, TRAINED, Ledger, LedgerError

PROMPTS = [10, 11, 12, 13]


@pytest.fixture
def fast_dir(tmp_path_factory):
    """A directory on tmpfs where there is one: fsync costs nothing there, and a kill -9 (unlike a power cut) leaves
    the page cache intact, so the crash tests lose nothing by it; the other tests write to disk with real fsyncs."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        path = tempfile.mkdtemp(prefix="reasonrl-ledger-", dir=shm)
        yield Path(path)
        shutil.rmtree(path, ignore_errors=True)
    else:
        yield tmp_path_factory.mktemp("ledger-crash")


def record_script(path):
    """The recorded session; its journal lines are numbered in the comments (line 1: the epoch record)."""
    ledger = Ledger.open(path, 3, PROMPTS)                  # 1
    assert ledger.issue(10, "r0") == 1                      # 2
    assert ledger.issue(11, "r1") == 1                      # 3
    assert ledger.issue(12, "r0") == 1                      # 4
    assert ledger.complete(10, 1, {"reward": 1.0})          # 5
    assert ledger.replica_lost("r1", "killed") == [11]      # 6: revoke 11
    assert ledger.issue(11, "r0") == 2                      # 7
    assert not ledger.complete(11, 1, {"late": True})       # (no line: the dead replica's answer is dropped)
    assert ledger.fail(12, 1, "verifier timeout")           # 8
    assert ledger.complete(11, 2, {"reward": 0.0})          # 9
    assert ledger.issue(13, "r0") == 1                      # 10
    ledger.close()                                          # the process dies with 13 in flight


# after a crash with the first k lines complete, then open(): (done, failed, revoked on resume), by hand
EXPECTED = {
    0: ([], [], []), 1: ([], [], []),
    2: ([], [], [10]), 3: ([], [], [10, 11]), 4: ([], [], [10, 11, 12]),
    5: ([10], [], [11, 12]), 6: ([10], [], [12]), 7: ([10], [], [11, 12]),
    8: ([10], [12], [11]), 9: ([10, 11], [12], []), 10: ([10, 11], [12], [13]),
}


@pytest.fixture(scope="module")
def journal(tmp_path_factory):
    path = tmp_path_factory.mktemp("ledger") / "epoch3.jsonl"
    record_script(path)
    data = path.read_bytes()
    assert data.count(b"\n") == 10 and data.endswith(b"\n")
    return data


def test_the_recorded_session_holds_one_state_per_prompt(tmp_path, journal):
    path = tmp_path / "j.jsonl"
    path.write_bytes(journal)
    ledger = Ledger.open(path, 3, PROMPTS)
    assert ledger.state(10).payload == {"reward": 1.0} and ledger.state(11).payload == {"reward": 0.0}
    assert ledger.state(11).attempt == 2 and ledger.state(12).reason == "verifier timeout"
    assert ledger.counts() == {PENDING: 1, ISSUED: 0, DONE: 2, FAILED: 1, TRAINED: 0}
    assert ledger.revoked_on_resume == [13] and ledger.state(13).attempt == 1


def test_a_crash_at_every_byte_loses_and_duplicates_nothing(fast_dir, journal):
    for offset in range(len(journal) + 1):
        path = fast_dir / f"cut{offset}.jsonl"
        path.write_bytes(journal[:offset])
        complete_lines = journal[:offset].count(b"\n")
        done, failed, revoked = EXPECTED[complete_lines]
        ledger = Ledger.open(path, 3, PROMPTS)
        where = f"cut at byte {offset} ({complete_lines} lines)"
        assert ledger.in_state(DONE) == done, where
        assert ledger.in_state(FAILED) == failed, where
        assert ledger.revoked_on_resume == revoked, where
        assert ledger.issued() == [], where
        assert sorted(ledger.pending() + done + failed) == PROMPTS, where  # each prompt in exactly one state
        # the resumed run issues exactly the rest; a late answer of any attempt before the crash is refused
        for index in ledger.pending():
            old = ledger.state(index).attempt
            attempt = ledger.issue(index, "r9")
            assert attempt == old + 1, where
            assert old == 0 or not ledger.complete(index, old, "late"), where
            assert ledger.complete(index, attempt, {"resumed": True}), where
        ledger.close()
        ops = [json.loads(line) for line in path.read_bytes().splitlines()]
        done_lines = Counter(op["i"] for op in ops if op["op"] == "done")
        assert done_lines == Counter([10, 11, 13] if complete_lines >= 8 else PROMPTS), where  # each once
        again = Ledger.open(path, 3, PROMPTS)  # and a second open of the finished journal revokes nothing
        assert again.finished() and again.revoked_on_resume == [], where
        again.close()


def test_a_resume_revokes_once_and_a_second_crash_does_not_revoke_again(tmp_path, journal):
    path = tmp_path / "j.jsonl"
    path.write_bytes(journal[:journal.index(b"\n", journal.index(b'"op":"issue","i":12')) + 1])  # 4 lines
    first = Ledger.open(path, 3, PROMPTS)
    assert first.revoked_on_resume == [10, 11, 12]
    first.close()
    second = Ledger.open(path, 3, PROMPTS)  # killed right after the resume: nothing is in flight any more
    assert second.revoked_on_resume == [] and second.pending() == PROMPTS
    assert [second.state(i).attempt for i in PROMPTS] == [1, 1, 1, 0]


def test_a_dead_replicas_prompts_are_issued_again_exactly_once(tmp_path):
    ledger = Ledger.open(tmp_path / "j.jsonl", 0, [0, 1, 2])
    a0, a1, a2 = ledger.issue(0, "a"), ledger.issue(1, "b"), ledger.issue(2, "a")
    assert ledger.replica_lost("a", "kill -9") == [0, 2]
    assert ledger.replica_lost("a", "kill -9") == []          # a second report of the same death re-issues nothing
    with pytest.raises(LedgerError, match="prompt 0 is pending, not issued"):
        ledger.revoke(0, "again")
    assert ledger.issue(0, "b") == 2
    assert not ledger.complete(0, a0, "late from a")          # the dead replica's attempt: dropped
    assert ledger.complete(0, 2, "from b") and ledger.complete(1, a1, "b")
    assert not ledger.complete(1, a1, "twice")               # a second answer of a finished attempt: dropped
    with pytest.raises(LedgerError, match="prompt 1 is done, not pending"):
        ledger.issue(1, "b")
    assert ledger.pending() == [2] and ledger.state(2).attempt == a2


def test_refusals_name_the_journal(tmp_path):
    path = tmp_path / "j.jsonl"
    Ledger.open(path, 0, [0, 1]).close()
    with pytest.raises(LedgerError, match="not epoch 1 over 2 prompts"):
        Ledger.open(path, 1, [0, 1])
    with pytest.raises(LedgerError, match="not epoch 0 over 2 prompts in this order"):
        Ledger.open(path, 0, [1, 0])
    with pytest.raises(LedgerError, match="repeat"):
        Ledger.open(tmp_path / "k.jsonl", 0, [0, 0])
    lines = path.read_bytes()
    path.write_bytes(lines + b'{"op":"done","i":0,"attempt":1}\n')  # done without an issue
    with pytest.raises(LedgerError, match="line 2 .* does not replay: prompt 0 attempt 1 is not the one in flight"):
        Ledger.open(path, 0, [0, 1])
    path.write_bytes(lines + b"garbage\n" + b'{"op":"issue","i":0,"replica":"a","attempt":1}\n')
    with pytest.raises(LedgerError, match="line 2 is not a JSON record"):
        Ledger.open(path, 0, [0, 1])
    ledger = Ledger.open(tmp_path / "m.jsonl", 0, [0])
    with pytest.raises(LedgerError, match="prompt 7 is not in epoch 0's ledger"):
        ledger.issue(7, "a")


# ----------------------------------------------------------------------------- real processes, killed with SIGKILL

CHILD = textwrap.dedent("""
    import sys, threading
    from reasonrl.fleet.ledger import Ledger

    path, prompts, report_after, torn_line = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    written = [0]

    class TornAt(Ledger):
        def _write_line(self, line):
            written[0] += 1
            if written[0] == torn_line:  # half the line on disk, then say so and wait for the kill
                self._file.write(line[:len(line) // 2])
                super()._write_line(b"")
                print("torn", flush=True)
                threading.Event().wait()
            super()._write_line(line)

    ledger = TornAt.open(path, 0, range(prompts))
    print("revoked", *ledger.revoked_on_resume, flush=True)
    done = 0
    for index in ledger.pending():
        attempt = ledger.issue(index, "r0")
        assert ledger.complete(index, attempt, {"reward": index % 2})
        done += 1
        if done == report_after:
            print("progress", flush=True)  # and go on writing until the kill lands
    print("finished", flush=True)
    threading.Event().wait()
""")


def run_child(path, prompts, report_after=0, torn_line=0):
    """Start the child; return it once it printed its first line after the revoked list (the kill's cue)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(prompts), str(report_after), str(torn_line)],
                            stdout=subprocess.PIPE, text=True, env=env)
    revoked = proc.stdout.readline().split()
    assert revoked[:1] == ["revoked"], revoked
    cue = proc.stdout.readline().strip()
    return proc, [int(i) for i in revoked[1:]], cue


def kill(proc):
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL


def in_flight(path):
    """Prompts whose last journal record is an issue (read straight from the complete lines of the file)."""
    last = {}
    for line in path.read_bytes().split(b"\n")[:-1]:
        op = json.loads(line)
        if "i" in op:
            last[op["i"]] = op["op"]
    return sorted(i for i, op in last.items() if op == "issue")


def test_processes_killed_mid_write_and_mid_run_lose_and_duplicate_nothing(fast_dir):
    path, prompts = fast_dir / "epoch0.jsonl", 1000
    # 1. killed half-way through writing its 9th line (line 1: the epoch record; 2k+2: issue k, 2k+3: done k)
    proc, revoked, cue = run_child(path, prompts, torn_line=9)
    assert revoked == [] and cue == "torn"
    kill(proc)
    assert not path.read_bytes().endswith(b"\n")  # the torn line is there
    assert in_flight(path) == [3]                 # issued 0..3, done 0..2; the done line of 3 is torn
    # 2. the resume issues 3 again; killed while it runs free, somewhere after its 200th result
    proc, revoked, cue = run_child(path, prompts, report_after=200)
    assert revoked == [3] and cue == "progress"
    kill(proc)
    flying = in_flight(path)
    assert len(flying) <= 1
    # 3. the last resume finishes the epoch
    proc, revoked, cue = run_child(path, prompts)
    assert revoked == flying and cue == "finished"
    kill(proc)
    ledger = Ledger.open(path, 0, range(prompts))
    assert ledger.finished() and ledger.counts()[DONE] == prompts and ledger.revoked_on_resume == []
    ops = [json.loads(line) for line in path.read_bytes().splitlines()]
    done_lines = Counter(op["i"] for op in ops if op["op"] == "done")
    assert set(done_lines) == set(range(prompts)) and set(done_lines.values()) == {1}  # 0 lost, 0 duplicated
    assert Counter(op["reason"] for op in ops if op["op"] == "revoke") == Counter({RESUME: 1 + len(flying)})


def test_trained_follows_done_only_and_replays(tmp_path):
    path = tmp_path / "j.jsonl"
    ledger = Ledger.open(path, 0, PROMPTS)
    a = ledger.issue(10, "r0")
    with pytest.raises(LedgerError, match="prompt 10 is issued, not done"):
        ledger.trained(10)
    assert ledger.complete(10, a, {"x": 1})
    ledger.trained(10)
    with pytest.raises(LedgerError, match="prompt 10 is trained, not done"):
        ledger.trained(10)  # trained once, never twice
    ledger.close()
    again = Ledger.open(path, 0, PROMPTS)
    assert again.state(10).state == TRAINED and again.state(10).payload == {"x": 1}
    assert again.counts() == {PENDING: 3, ISSUED: 0, DONE: 0, FAILED: 0, TRAINED: 1}


def test_a_done_prompt_the_loop_cannot_train_on_is_dropped_and_the_journal_replays_it(tmp_path):
    """done --drop(reason)--> failed: finished for the epoch, neither trainable nor droppable again, and a reopen
    replays it."""
    path = tmp_path / "round.jsonl"
    ledger = Ledger.open(path, 0, [0, 1])
    for i in (0, 1):
        assert ledger.complete(i, ledger.issue(i, "replica0"))
    ledger.drop(1, "every sample failed verification (math: timed out)")
    ledger.trained(0)
    assert ledger.state(1).state == FAILED and ledger.state(1).reason.startswith("every sample failed")
    assert ledger.finished()
    with pytest.raises(LedgerError, match="prompt 1 is failed, not done"):
        ledger.trained(1)
    with pytest.raises(LedgerError, match="prompt 0 is trained, not done"):
        ledger.drop(0, "again")
    ledger.close()
    again = Ledger.open(path, 0, [0, 1])
    assert again.counts() == {"pending": 0, "issued": 0, "done": 0, "failed": 1, "trained": 1}
    assert again.state(1).reason == "every sample failed verification (math: timed out)"
    again.close()
