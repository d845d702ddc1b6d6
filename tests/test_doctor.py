"""The doctor's checks run for real on this machine; check_requirements reports what a config needs."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from reasonrl.config import load_config
from reasonrl.doctor import (Check, MissingRequirements, _vllm_distribution, check_bwrap, check_docker, check_lean,
                             check_requirements, ensure_requirements, format_table, gpu_count, vllm_torch_mismatch)

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
    with pytest.raises(MissingRequirements, match="model.path: ./no/such/model does not exist") as info:
        ensure_requirements(cfg)
    assert len(info.value.problems) == 3


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
    dist = _vllm_distribution()
    if dist is None:
        pytest.skip("vllm is not installed")
    import torch

    # install.sh pairs vllm(-cpu) with the torch it was built for.
    assert vllm_torch_mismatch(dist, torch.__version__) is None
    # A torch far older than any vllm supports violates the pin.
    assert vllm_torch_mismatch(dist, "1.0.0").startswith("torch")
