"""What this machine has, asked of torch once per process: the device a run computes on and its GPU count. The plan
(``reasonrl.config.plan``) takes these as arguments and never imports torch itself."""
from __future__ import annotations

from reasonrl.config.device_defaults import Hardware


def cuda_available() -> bool:
    """Whether torch sees a GPU here (``trainer.profile=auto`` and ``trainer.device=auto`` ask this)."""
    import torch

    return torch.cuda.is_available()


def resolve_device(trainer_device: str) -> str:
    """The device a process computes on: ``trainer.device`` when it names one, else cuda when torch sees a GPU
    (``auto``). The one rule every process applies: the controller (the plan), eval and the workers."""
    if trainer_device != "auto":
        return trainer_device
    return "cuda" if cuda_available() else "cpu"


def varlen_kernel_importable() -> bool:
    """Whether this torch has ``torch.nn.attention.varlen.varlen_attn`` (2.11 on; its kernel is CUDA-only)."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def local_hardware(trainer_device: str) -> Hardware:
    """This machine as the plan sees it: the resolved device, the GPUs torch sees, whether its torch has the varlen
    attention kernel and whether vLLM is installed."""
    import importlib.util

    import torch

    device = resolve_device(trainer_device)
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    return Hardware(device=device, gpu_count=gpus, varlen_attention=varlen_kernel_importable(),
                    vllm_installed=importlib.util.find_spec("vllm") is not None)
