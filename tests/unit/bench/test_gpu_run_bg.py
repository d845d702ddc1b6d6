"""`benchmarks/gpu_run.sh bg MODE` and `wait SECONDS`: a job that outlives the device call that starts it.

The device keeps a process that started its own session (setsid) after a call returns, so one long run (the
GSM8K curve's 200 steps) can span calls with one engine start. These tests run the real script on this machine
with a job directory of their own (``BG_OUT``)."""

import os
import re
import signal
import subprocess
from pathlib import Path

from paths import REPO

SCRIPT = REPO / "benchmarks" / "gpu_run.sh"


def gpu_run(*args, bg_out: Path, out: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "BG_OUT": str(bg_out), "OUT": str(out), "NO_SETUP": "1",
           "RUNS_ROOT": str(bg_out.parent / "runs")}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_wait_returns_the_jobs_exit_status_and_its_files(tmp_path):
    bg_out, out = tmp_path / "bg", tmp_path / "out"
    started = gpu_run("bg", "nosuchmode", bg_out=bg_out, out=out)
    assert started.returncode == 0, started.stderr
    assert "started in the background: gpu_run.sh nosuchmode" in started.stdout
    # the job ends at once (gpu_run.sh exits 2 on an unknown mode); wait returns when it writes rc
    waited = gpu_run("wait", "60", bg_out=bg_out, out=out)
    assert waited.returncode == 2, waited.stdout + waited.stderr
    assert "bg job ended: rc 2" in waited.stdout
    assert sorted(p.name for p in out.iterdir()) == ["bg.log", "rc"]
    log = (out / "bg.log").read_text()
    assert log.startswith("bg: nosuchmode\n")
    assert "unknown command nosuchmode" in log


def test_a_second_job_is_refused_while_the_first_runs(tmp_path):
    bg_out, out = tmp_path / "bg", tmp_path / "out"
    # the job is itself a `wait` on the same directory: it runs until an rc file appears there (or 300 s pass), so
    # it is certainly still running when the second `bg` comes
    started = gpu_run("bg", "wait", "300", bg_out=bg_out, out=out)
    assert started.returncode == 0, started.stderr
    pid = int(re.search(r"pid (\d+)", started.stdout).group(1))  # the job's session leader (setsid)
    try:
        refused = gpu_run("bg", "nosuchmode", bg_out=bg_out, out=out)
        assert refused.returncode == 2
        assert "a bg job is still running: bg: wait 300" in refused.stderr
        assert not (bg_out / "rc").exists()
        assert "nosuchmode" not in (bg_out / "bg.log").read_text()  # the running job's log is untouched
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)  # the whole session: the job and its `sleep`
        except ProcessLookupError:
            pass


def test_wait_without_a_job_says_so(tmp_path):
    waited = gpu_run("wait", "5", bg_out=tmp_path / "none", out=tmp_path / "out")
    assert waited.returncode == 2
    assert "no bg job on this machine" in waited.stderr


def test_series_runs_every_line_in_turn_and_exits_with_the_first_failure(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing to run\n")
    series = tmp_path / "series.txt"
    # a: an empty series (rc 0); b: an unknown mode (rc 2); c runs although b failed; comments and blank lines skip
    series.write_text(f"# a comment\na series {empty}\n\nb nosuchmode 'one word'\nc series {empty}\n")
    out = tmp_path / "out"
    done = gpu_run("series", str(series), bg_out=tmp_path / "bg", out=out)
    assert done.returncode == 2, done.stdout + done.stderr
    ended = [line for line in done.stdout.splitlines() if " ended: rc " in line]
    assert ended == ["series: a ended: rc 0", "series: b ended: rc 2", "series: c ended: rc 0"]
    assert "unknown command nosuchmode" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["a", "b", "c"]  # each line's $OUT


def test_series_waits_between_lines_until_the_gpu_is_free(tmp_path):
    # no GPU here, so nvidia-smi and the MPS control binary are stand-ins on PATH (the only fakes of this file): the
    # last line's process stays listed for the first two queries and the daemon answers for the first one
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"""#!/bin/bash
n=$(cat {state}/smi 2>/dev/null || echo 0); echo $((n + 1)) > {state}/smi
[ "$n" -lt 2 ] && echo "4242, python"
exit 0
""")
    (bin_dir / "nvidia-cuda-mps-control").write_text(f"""#!/bin/bash
cat > /dev/null; n=$(cat {state}/mps 2>/dev/null || echo 0); echo $((n + 1)) > {state}/mps
[ "$n" -lt 1 ]
""")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing to run\n")
    series = tmp_path / "series.txt"
    series.write_text(f"a series {empty}\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"), "NO_SETUP": "1"}
    done = subprocess.run(["bash", str(SCRIPT), "series", str(series)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    # queries 1 and 2 list the process (the first also finds the daemon); the third finds the GPU free
    assert "series: settle after a: GPU free in 3 s" in done.stdout.splitlines()
