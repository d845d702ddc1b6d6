"""benchmarks/engine_step_overhead.py's summary and derived figures, worked by hand (no model; the measurement itself
is the script's run, results/engine_step_overhead_cpu.json)."""
from __future__ import annotations

import pytest
from helpers import benchmark_module


@pytest.fixture(scope="module")
def bench():
    return benchmark_module("engine_step_overhead")


def test_way_summary_is_of_the_median_wall(bench):
    # walls 3.0, 2.0, 4.0 s: median 2.0 < 3.0 < 4.0 -> 3.0 s; 512 tokens / 3.0 s; 3000 ms over 100 steps = 30 ms
    way = bench.way_summary([3.0, 2.0, 4.0], tokens=512, steps=100, note="assumed")
    assert way["wall_s"] == [3.0, 2.0, 4.0]
    assert (way["wall_s_spread"]["median"], way["wall_s_spread"]["min"], way["wall_s_spread"]["max"]) == (3.0, 2.0, 4.0)
    assert way["tokens_per_s"] == pytest.approx(512 / 3.0)
    assert way["ms_per_step"] == pytest.approx(30.0)
    assert way["steps"] == 100 and way["steps_note"] == "assumed"
    assert "steps_note" not in bench.way_summary([1.0], 1, 1)


def test_derived_differences_per_step(bench):
    # async 2.0 s, sync 2.5 s, stepper 2.8 s, each over 100 steps: 20, 25, 28 ms -> stepper - sync 3 ms, sync - async 5
    ways = {"generate_async_default": bench.way_summary([2.0], 10, 100),
            "generate_sync": bench.way_summary([2.5], 10, 100),
            "stepper": bench.way_summary([2.8], 10, 100)}
    got = bench.derived(ways)
    assert got["stepper_over_generate_sync_ms_per_step"] == pytest.approx(3.0)
    assert got["sync_over_async_ms_per_step"] == pytest.approx(5.0)


def test_a_way_not_measured_gives_null(bench):
    ways = {"generate_async_default": {"skipped": bench.CPU_SKIP}, "generate_sync": bench.way_summary([2.5], 10, 100)}
    assert bench.derived(ways) == {"stepper_over_generate_sync_ms_per_step": None, "sync_over_async_ms_per_step": None}
    assert bench.derived({}) == {"stepper_over_generate_sync_ms_per_step": None, "sync_over_async_ms_per_step": None}


def test_random_prompts_are_seeded(bench):
    a = bench.random_prompts(3, 5, vocab=100, seed=7)
    assert len(a) == 3 and all(len(p) == 5 and all(0 <= t < 100 for t in p) for p in a)
    assert a == bench.random_prompts(3, 5, vocab=100, seed=7) != bench.random_prompts(3, 5, vocab=100, seed=8)
