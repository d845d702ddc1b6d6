"""The same-GPU async benchmark's library (reasonrl/bench/async_step.py): a step's record and the timed steps'
summary from train_step metrics (numbers by hand), and (slow) benchmarks/gpu_async_step.py's CPU dry run of the
same-GPU async mode through the real trainer, Ray and the hf engine, writing its JSON."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from paths import REPO

from reasonrl.bench.async_step import batches_to_draw, lag_histogram, spread, step_record, summarize, warmup_steps


def metrics(step_s, tokens_per_s, lag0, lag1, staleness=None):
    out = {"timing_s/rollout": 1.0, "timing_s/update_actor": 2.0, "timing_s/step": step_s,
           "perf/tokens_per_s": tokens_per_s, "perf/rollout_tokens_per_s": 300.0,
           "admission/lag_tokens/0": lag0, "admission/lag_tokens/1": lag1, "admission/in_flight": 3.0}
    if staleness is not None:
        out["async/staleness"] = staleness
    return out


def test_step_record_counts_the_trained_batch_per_wall_second():
    rec = step_record(metrics(4.0, 250.0, 10.0, 5.0, staleness=1.0), wall_s=5.0)
    assert rec["trained_tokens"] == 1000  # 250 tok/s x 4 s of step
    assert rec["trained_tokens_per_s"] == 200.0  # per wall second around train_step: 1000 / 5
    assert rec["response_tokens"] == 300 and rec["response_tokens_per_s"] == 60.0  # 300 tok/s x 1 s rollout, / 5
    assert rec["seconds"] == {"rollout": 1.0, "update_actor": 2.0, "step": 4.0}
    assert rec["lag"] == {"admission/lag_tokens/0": 10.0, "admission/lag_tokens/1": 5.0}  # in_flight is not a lag
    assert rec["staleness"] == 1.0
    assert "partial" not in rec  # no per-token versions, no partial record


def test_step_record_keeps_the_share_partial_rollouts_carried_across_a_load():
    m = {**metrics(4.0, 250.0, 10.0, 5.0), "rollout/partial_spanning_frac": 0.25,
         "rollout/partial_newer_token_frac": 0.1, "rollout/logprob_diff_max": 3.0}
    assert step_record(m, wall_s=5.0)["partial"] == {"partial_spanning_frac": 0.25, "partial_newer_token_frac": 0.1}


def test_step_record_keeps_the_updates_health_non_finite_included():
    m = {**metrics(4.0, 250.0, 10.0, 5.0), "actor/grad_norm": float("nan"), "actor/skipped_optimizer_steps": 1.0,
         "actor/pg_loss": 0.5, "actor/kl": 0.2}
    update = step_record(m, wall_s=5.0)["update"]
    assert set(update) == {"actor/grad_norm", "actor/skipped_optimizer_steps", "actor/pg_loss"}  # not the kl
    assert update["actor/grad_norm"] != update["actor/grad_norm"]  # NaN kept as NaN
    assert update["actor/skipped_optimizer_steps"] == 1.0
    assert "update" not in step_record(metrics(4.0, 250.0, 10.0, 5.0), wall_s=5.0)  # no update metrics, no record


def test_summary_median_spread_and_the_lag_counters_growth():
    assert spread([4.0, 1.0, 3.0, 2.0]) == {"median": 2.5, "min": 1.0, "p25": 1.75, "p75": 3.25, "max": 4.0}
    assert spread([7.0]) == {"median": 7.0, "min": 7.0, "p25": 7.0, "p75": 7.0, "max": 7.0}
    warm = step_record(metrics(1.0, 100.0, 100.0, 0.0, staleness=0.0), 1.0)
    timed = [step_record(metrics(1.0, r, 100.0 + 50 * i, 20.0 * i, staleness=1.0), 1.0)
             for i, r in enumerate((300.0, 100.0, 200.0), start=1)]
    # the admission counters are cumulative: the last timed step (250, 60) minus the warm-up's (100, 0)
    assert lag_histogram(timed, warm) == {"admission/lag_tokens/0": 150.0, "admission/lag_tokens/1": 60.0}
    assert lag_histogram(timed, None)["admission/lag_tokens/0"] == 250.0
    s = summarize(timed, warm)
    assert s["steps"] == 3 and s["trained_tokens_per_s"]["median"] == 200.0
    assert (s["trained_tokens_per_s"]["min"], s["trained_tokens_per_s"]["max"]) == (100.0, 300.0)
    assert s["staleness_steps"] == {"1": 3}
    assert "actor_alloc_retries" not in s  # no memory probe on a CPU
    # the allocator's retries are cumulative since the actor started: 7 at the warm-up, 7, 9, 12 after the timed steps
    warm["actor_memory"] = {"alloc_retries": 7.0}
    for rec, retries in zip(timed, (7.0, 9.0, 12.0)):
        rec["actor_memory"] = {"alloc_retries": retries}
    assert summarize(timed, warm)["actor_alloc_retries"] == 5.0  # 12 - 7
    assert summarize(timed, None)["actor_alloc_retries"] == 12.0
    assert "publish_s" not in summarize(timed, warm)  # colocated: no publish seconds reported


def test_summary_pools_alternating_steps_where_the_median_falls_between_them():
    # four steps of 1000 trained tokens each, walls 50, 10, 50, 10 s: the rates are 20, 100, 20, 100 tokens/s, whose
    # median is 60; all 4000 tokens over all 120 s is 33.3 tokens/s, and the mean wall 30 s
    timed = [step_record({"timing_s/step": 1.0, "perf/tokens_per_s": 1000.0}, wall)
             for wall in (50.0, 10.0, 50.0, 10.0)]
    s = summarize(timed)
    assert s["trained_tokens_per_s"]["median"] == pytest.approx(60.0)
    assert s["trained_tokens_per_s_pooled"] == pytest.approx(4000.0 / 120.0)
    assert s["wall_s_mean"] == pytest.approx(30.0) and s["wall_s"]["median"] == pytest.approx(30.0)


def test_the_async_warm_up_covers_the_batches_started_before_the_lengths():
    from reasonrl.config import load_config
    from reasonrl.config.plan import RunPlan
    from reasonrl.hardware import local_hardware

    def steps_ahead(*overrides):
        cfg, _ = load_config(list(overrides), cuda_available=False)
        return RunPlan.build(cfg, local_hardware(cfg.trainer.device)).steps_ahead

    assert warmup_steps(None, steps_ahead("async_rollout.max_staleness=3")) == 1  # colocated: nothing runs ahead
    assert warmup_steps(None, steps_ahead("trainer.mode=async")) == 2  # k = 1 unless set: batches 0 and 1
    assert warmup_steps(None, steps_ahead("trainer.mode=async", "async_rollout.max_staleness=0",
                                          "async_rollout.max_staleness=2")) == 3
    assert warmup_steps(4, 2) == 4  # --warmup wins


def test_each_replicas_groups_are_kept_per_step_and_absent_without_a_fleet():
    m = metrics(4.0, 250.0, 10.0, 5.0)
    assert "fleet_load" not in step_record(m, wall_s=5.0)
    m.update({"fleet/load/replica0": 64.0, "fleet/load/replica1": 0.0, "fleet/restarts": 0.0})
    assert step_record(m, wall_s=5.0)["fleet_load"] == {"replica0": 64.0, "replica1": 0.0}


def test_the_fleet_draws_k_batches_beyond_the_last_timed_step():
    # k = 1: 2 warm-up + 8 timed steps train batches 0..9; batch 10 is drawn so that the replica still generates
    # beside the 10th update, as it would in a longer run. Colocated draws exactly what it trains.
    assert batches_to_draw(2, 8, 1) == 11
    assert batches_to_draw(3, 8, 2) == 13
    assert batches_to_draw(1, 8, 0) == 9


def test_the_publish_seconds_a_step_reports_are_kept_per_part():
    timed = []
    for gather in (1.0, 3.0, 2.0):
        m = metrics(1.0, 100.0, 0.0, 0.0)
        m.update({"weight_sync/gather_s": gather, "weight_sync/put_s": gather / 2, "weight_sync/bytes": 8.0})
        timed.append(step_record(m, 1.0))
    assert timed[0]["publish_s"] == {"gather": 1.0, "put": 0.5}  # bytes is not seconds
    s = summarize(timed)
    assert s["publish_s"]["gather"]["median"] == 2.0 and s["publish_s"]["put"]["max"] == 1.5


@pytest.mark.slow  # Ray, the actor and a replica on the CPU: about 35 s on the shared 2-core machine
def test_cpu_dry_run_of_the_same_gpu_async_mode(tmp_path):
    out = tmp_path / "async.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "gpu_async_step.py"), "--shape", "tiny", "--engine", "hf",
           "--length-dist", "fixed", "--modes", "async", "--prompts", "2", "--n", "2", "--prompt-len", "16",
           "--response-len", "16", "--steps", "2", "--warmup", "1", "--micro-batch", "4",
           "--model-dir", str(tmp_path / "model"), "--out", str(out),
           "--async-set", "trainer.mode=async", "--async-set", "fleet.enabled=true",
           "--async-set", "async_rollout.share_devices=true"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "main: 1 worker(s) x 1 CPU (actor, async_rollout)" in proc.stdout  # the replica on the actor's pool
    result = json.loads(out.read_text())
    entry = result["modes"]["async"]
    assert result["status"] == "ok" and entry["plan"]["share_devices"] and entry["plan"]["rollout_workers"] == 1
    assert len(entry["steps"]) == 2 and entry["summary"]["steps"] == 2
    for step in entry["steps"]:
        assert step["trained_tokens"] == 2 * 2 * (16 + 16)  # every response 16 tokens: ignore_eos on the plan
        assert step["trained_tokens_per_s"] == pytest.approx(step["trained_tokens"] / step["wall_s"])


def test_the_lease_table_gives_both_ratios_over_the_baseline():
    from helpers import benchmark_module

    bench = benchmark_module("async_step_table")
    # baseline: two 20 s steps of 2000 tokens (100 tokens/s each); the other: walls 40 and 10 s of 2000 tokens each
    # (50 and 200 tokens/s: median 125 -> 1.25x; pooled 4000 / 50 s = 80 -> 0.80x)
    def run(mode, walls):
        return {"modes": {mode: {"steps": [step_record({"timing_s/step": 1.0, "perf/tokens_per_s": 2000.0}, w)
                                           for w in walls]}}}

    runs = {label: bench.run_summary(run(mode, walls))[1]
            for label, mode, walls in (("base", "colocated", (20.0, 20.0)), ("other", "async", (40.0, 10.0)))}
    rows = {r["label"]: r for r in bench.table(runs, "base")}
    assert rows["base"]["over_baseline_medians"] == rows["base"]["over_baseline_pooled"] == 1.0
    assert rows["other"]["over_baseline_medians"] == pytest.approx(1.25)
    assert rows["other"]["over_baseline_pooled"] == pytest.approx(0.80)
    assert "| other | 2 | 25.00 (10.00-40.00) | 25.00 | 125 (50-200) | 80 | 1.25, 0.80 |" in bench.markdown(list(
        rows.values()))
    with pytest.raises(ValueError, match="one mode"):
        bench.run_summary({"modes": {"a": {}, "b": {}}})
