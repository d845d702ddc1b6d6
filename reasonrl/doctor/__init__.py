"""The doctor: what this machine can run, and what a training config needs that is missing.

``python -m reasonrl.doctor [key=value ...] [--json]`` (``cli``) prints one row per check (``checks``; the GPU rows,
on a machine with NVIDIA GPUs, from ``gpu``) and, for a config, its missing pieces (``requirements``).
"""
from .checks import (Check, check_bwrap, check_cuda, check_disk, check_docker, check_lean, check_memory, check_package,
                     check_python, check_torch, check_vllm, gpu_count, vllm_distribution, vllm_torch_mismatch)
from .cli import format_table, main, run_checks
from .gpu import gpu_checks
from .requirements import Problem, check_requirements

__all__ = ["Check", "Problem", "check_bwrap", "check_cuda", "check_disk", "check_docker", "check_lean", "check_memory",
           "check_package", "check_python", "check_requirements", "check_torch", "check_vllm", "format_table",
           "gpu_checks", "gpu_count", "main", "run_checks", "vllm_distribution", "vllm_torch_mismatch"]
