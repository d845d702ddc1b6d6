"""The watchdog's limit (numbers by hand) and the fault-point syntax that tests use to interrupt runs."""
import threading

import pytest

from reasonrl.fault_points import parse
from reasonrl.trainer.watchdog import PhaseHangError, PhaseWatchdog, phase_limit_s


def test_phase_limit_is_factor_times_median_within_floor_and_ceiling():
    # Fewer than 3 calls known: only the ceiling applies.
    assert phase_limit_s([], 10, 60, 3600) == 3600
    assert phase_limit_s([5.0, 5.0], 10, 60, 3600) == 3600
    # Median of [2, 30, 40] is 30; 10 x 30 = 300, between the floor 60 and the ceiling 3600.
    assert phase_limit_s([2.0, 30.0, 40.0], 10, 60, 3600) == 300
    # Median 2 -> 20 s, below the floor: 60.
    assert phase_limit_s([2.0, 2.0, 9.0], 10, 60, 3600) == 60
    # Median 500 -> 5000 s, above the ceiling: 3600.
    assert phase_limit_s([500.0] * 3, 10, 60, 3600) == 3600
    assert phase_limit_s([500.0] * 3, 10, 60, 0) is None  # ceiling 0: watchdog off


def test_watchdog_keeps_recent_history_per_phase_and_names_the_hang(capsys):
    wd = PhaseWatchdog(factor=4, min_s=1, max_s=100)
    for s in (1.0, 2.0, 3.0):
        wd.record("generate", s)
    assert wd.limit_s("generate") == 8      # 4 x median 2
    assert wd.limit_s("update_actor") == 100  # unseen phase: the ceiling
    with pytest.raises(PhaseHangError, match="phase 'generate'.*rank\\(s\\) 1"):
        wd.hung("ActorRolloutRefWorker", "generate", [1], 8.5, {1: "File \"x.py\", line 3 in spin"})
    assert "spin" in capsys.readouterr().err


def test_fault_point_spec():
    assert parse("group.generate#2=sigint, checkpoint.written=sigkill") == {
        ("group.generate", 2): "sigint", ("checkpoint.written", 1): "sigkill"}
    for bad in ("group.generate=explode", "=sigint", "x#two=sigint"):
        with pytest.raises(ValueError, match="REASONRL_FAULT_AT"):
            parse(bad)


def test_a_raise_fault_point_raises_only_at_the_arrivals_it_names(monkeypatch):
    """``fleet.prompt13.generate#1=raise,...#2=raise``: the first two arrivals raise FaultRaised, the third runs."""
    from reasonrl import fault_points

    monkeypatch.setenv(fault_points.ENV, "fleet.prompt13.generate#1=raise,fleet.prompt13.generate#2=raise")
    monkeypatch.setattr(fault_points, "_hits", fault_points.Counter())
    for _ in range(2):
        with pytest.raises(fault_points.FaultRaised, match="fault point: raise"):
            fault_points.fault_point("fleet.prompt13.generate")
    fault_points.fault_point("fleet.prompt13.generate")
    assert fault_points._hits["fleet.prompt13.generate"] == 3


def test_first_ctrl_c_asks_to_stop_the_second_aborts_and_handlers_are_restored():
    import os
    import signal

    from reasonrl.interrupt import stop_at_boundary

    before = signal.getsignal(signal.SIGINT)
    with stop_at_boundary("finishing the step in flight") as stop:
        os.kill(os.getpid(), signal.SIGINT)  # handled at the next bytecode: the loop would finish its step
        assert stop.requested and stop.signal_name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs when the call returns
    assert signal.getsignal(signal.SIGINT) is before
    with stop_at_boundary("finishing the step in flight") as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signal_name == "SIGTERM"


def test_a_sigint_fault_point_has_asked_to_stop_when_it_returns(monkeypatch, capsys):
    """The loop checks the stop request right after the fault point: the request must be there by then (eval's
    interrupt test once finished the whole run because the signal reached the handler too late)."""
    from reasonrl import fault_points
    from reasonrl.interrupt import stop_at_boundary

    monkeypatch.setenv(fault_points.ENV, "test.point#2=sigint")
    monkeypatch.setattr(fault_points, "_hits", fault_points.Counter())
    with stop_at_boundary("finishing the batch in flight") as stop:
        fault_points.fault_point("test.point")
        assert not stop.requested  # the first arrival plans nothing
        fault_points.fault_point("test.point")
        assert stop.requested and stop.signal_name == "SIGINT"
    captured = capsys.readouterr()
    assert "fault point test.point#2: sigint" in captured.out
    assert "SIGINT: finishing the batch in flight" in captured.err


def test_pause_fault_point_needs_its_release_file_and_returns_once_it_exists(monkeypatch, tmp_path, capsys):
    from reasonrl import fault_points

    monkeypatch.setattr(fault_points, "_hits", fault_points.Counter())
    monkeypatch.setenv("REASONRL_FAULT_AT", "step.begin#1=pause,step.begin#2=pause")
    monkeypatch.delenv("REASONRL_FAULT_RELEASE", raising=False)
    with pytest.raises(ValueError, match="REASONRL_FAULT_RELEASE"):
        fault_points.fault_point("step.begin")
    release = tmp_path / "release"
    monkeypatch.setenv("REASONRL_FAULT_RELEASE", str(release))
    held = threading.Thread(target=fault_points.fault_point, args=("step.begin",), daemon=True)
    held.start()
    held.join(0.3)
    assert held.is_alive()  # held while the file is missing
    release.touch()
    held.join(30)
    assert not held.is_alive()
    assert "fault point step.begin#2: pause" in capsys.readouterr().out


def test_the_local_heads_record_as_the_machines_current_cluster_is_forgotten(tmp_path):
    """``ray start`` records its head in ``ray_current_cluster``, which a bare ``ray.init()`` elsewhere on the machine
    joins (a later test's or a user's script, long after the run's head stopped); the head removes that record when it
    names its own port, and leaves another cluster's alone."""
    from reasonrl.controller.ray_head import forget_current_cluster

    record = tmp_path / "ray_current_cluster"
    record.write_text("192.0.2.2:44327")
    assert not forget_current_cluster(4432, str(record)) and record.exists()  # another port: not ours
    assert forget_current_cluster(44327, str(record)) and not record.exists()
    assert not forget_current_cluster(44327, str(record))  # nothing left to remove
