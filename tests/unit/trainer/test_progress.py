"""The console's progress: a phase timer reports each phase's start and end; the training bar prints a line per phase
on the first step only."""
from reasonrl.trainer.metrics import PhaseTimer
from reasonrl.trainer.progress import StepProgress, timed


def test_the_phase_timer_reports_start_and_end_with_the_seconds_it_adds():
    calls = []
    timer = PhaseTimer(lambda phase, seconds: calls.append((phase, seconds)))
    with timer("step"):
        with timer("rollout"):
            pass
    assert [c[0] for c in calls] == ["step", "rollout", "rollout", "step"]
    assert calls[0][1] is None and calls[1][1] is None
    assert calls[2][1] == timer.seconds["rollout"] and calls[3][1] == timer.seconds["step"]


def test_a_line_per_phase_on_the_first_step_only(capsys):
    progress = StepProgress(total=3, initial=0)
    for _ in range(2):
        timer = PhaseTimer(progress.phase)
        with timer("step"):
            with timer("rollout"):
                pass
        progress.step_done()
    progress.close()
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "step 1: rollout ..." and out[1].startswith("step 1: rollout done in ") and len(out) == 2, out


def test_timed_prints_before_and_after(capsys):
    with timed("starting Ray"):
        pass
    before, after = capsys.readouterr().out.splitlines()
    assert before == "reasonrl: starting Ray ..." and after.startswith("reasonrl: starting Ray: done in ")
