"""reasonrl/bench/peer_ratio.py with numbers worked by hand."""
import pytest

from reasonrl.bench.peer_ratio import machine_of, ours_step_seconds, spread, step_ratio, trl_step_seconds


def test_ratio_of_medians_and_its_range():
    # ours 30, 34, 31 -> median 31, min 30, max 34; TRL 60, 70, 62, 64 -> median (62 + 64) / 2 = 63
    r = step_ratio([30.0, 34.0, 31.0], [60.0, 70.0, 62.0, 64.0])
    assert r["ratio"] == pytest.approx(31 / 63)
    assert r["ratio_range"] == pytest.approx([30 / 70, 34 / 60])
    assert r["ours"] == {"median_s": 31.0, "min_s": 30.0, "max_s": 34.0, "steps": 3}
    assert r["peer"]["median_s"] == 63.0 and r["peer"]["steps"] == 4


def test_too_few_timed_steps_gives_no_ratio():
    r = step_ratio([30.0, 31.0], [60.0, 61.0, 62.0])
    assert r["ratio"] is None and "ours 2" in r["why"] and "peer" not in r["why"]
    with pytest.raises(ValueError):
        spread([])


def test_reads_both_json_layouts():
    ours = {"machine": {"gpu": "NVIDIA H200"}, "steps": [{"seconds": {"step": 3.5, "rollout": 1.0}}]}
    trl = {"modes": {"colocate": {"gpu": "NVIDIA H200", "steps": [{"seconds": 7.0}, {"seconds": 8.0}]}}}
    assert ours_step_seconds(ours) == [3.5] and trl_step_seconds(trl) == [7.0, 8.0]
    assert machine_of(ours) == machine_of(trl) == "NVIDIA H200"
    assert trl_step_seconds(trl, "generate") == [] and machine_of({}) is None
