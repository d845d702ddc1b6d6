"""Per-device defaults are resolved in one place (reasonrl/config/device_defaults.py) and printed with why."""
from __future__ import annotations

from reasonrl.config import load_config
from reasonrl.config.device_defaults import Hardware, device_settings, enforce_eager_for
from reasonrl.config.plan import RunPlan
from reasonrl.train import print_header


def _rows(settings):
    return {s.key: (s.value, s.why) for s in settings}


def test_enforce_eager_is_auto_by_default_and_resolves_per_device():
    cpu, _ = load_config(["task=arith"], cuda_available=False)
    gpu, _ = load_config(["task=arith"], cuda_available=True)
    assert cpu.rollout.enforce_eager is None and gpu.rollout.enforce_eager is None
    on_cpu = _rows(device_settings(cpu, "cpu"))
    on_gpu = _rows(device_settings(gpu, "cuda"))
    # what the workers are handed is the plan's copy; the loaded config keeps None
    assert RunPlan.build(cpu).run_config(cpu).rollout.enforce_eager is True
    assert RunPlan.build(gpu, Hardware("cuda", 1)).run_config(gpu).rollout.enforce_eager is False
    assert cpu.rollout.enforce_eager is None and gpu.rollout.enforce_eager is None
    assert on_cpu["rollout.enforce_eager"] == (True, "CPU default; GPU would be false (CUDA graphs)")
    assert on_gpu["rollout.enforce_eager"] == (False, "GPU default; CPU would be true")
    # GPU-only settings are shown on GPU; the CPU KV cache size on CPU.
    assert "rollout.gpu_memory_utilization" in on_gpu and "rollout.gpu_memory_utilization" not in on_cpu
    assert on_gpu["rollout.gpu_memory_utilization"][0] == 0.5
    assert "rollout.kv_cache_gb" in on_cpu and "rollout.kv_cache_gb" not in on_gpu
    # The CPU profile's micro-batch (4) is not the default (8), and says so.
    assert on_cpu["actor.micro_batch_size_per_worker"] == (4, "set by you or the CPU profile")
    assert on_gpu["actor.micro_batch_size_per_worker"][0] == 8
    assert on_gpu["actor.micro_batch_size_per_worker"][1].startswith("default")


def test_a_user_setting_wins_on_either_device():
    for device in ("cpu", "cuda"):
        for value in ("true", "false"):
            cfg, _ = load_config(["task=arith", f"rollout.enforce_eager={value}"], cuda_available=device == "cuda")
            row = _rows(device_settings(cfg, device))["rollout.enforce_eager"]
            assert row == (value == "true", "set by you")
            assert enforce_eager_for(cfg.rollout.enforce_eager, device) is (value == "true")
    assert enforce_eager_for(None, "cuda:1") is False and enforce_eager_for(None, "cpu") is True


def test_the_start_up_table_prints_the_effective_values_and_why(capsys):
    cfg, notes = load_config(["task=arith", "trainer.num_workers=2"], cuda_available=True)
    print_header(cfg, notes, RunPlan.build(cfg, Hardware("cuda", 2)))
    out = capsys.readouterr().out
    assert "---- per-device settings (cuda) ----" in out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("rollout.enforce_eager"))
    assert line.split()[:2] == ["rollout.enforce_eager", "false"] and line.endswith("(GPU default; CPU would be true)")
    assert "enforce_eager: false" in out  # the effective config shows the resolved value, not null
