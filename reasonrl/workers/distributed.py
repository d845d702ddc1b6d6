"""torch.distributed set-up for a worker: gloo on CPU, nccl on GPU, and a 1-D device mesh for FSDP2."""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def init_distributed(rank: int, world_size: int, master_addr: str, master_port: int, device: str):
    """Join the process group; returns the device mesh. A group of one rendezvouses in memory (no port: a free port
    picked ahead can be taken by another process before the store binds it)."""
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK="0")
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(0)  # Ray gives each worker one visible GPU
    if not dist.is_initialized():
        rendezvous = ({"store": dist.HashStore()} if world_size == 1
                      else {"init_method": f"tcp://{master_addr}:{master_port}"})
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(minutes=30), **rendezvous)
    return init_device_mesh(device, (world_size,))


def all_reduce_sum(value: float, device: str) -> float:
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item())


def all_reduce_max(value: float, device: str) -> float:
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def start_rank(device: str, seed: int, rank: int, world_size: int, master_addr: str, master_port: int,
               num_threads: int = 0):
    """What every worker rank does first on the plan's ``device``: cap CPU threads, join the group and seed torch.
    Returns (device, mesh)."""
    if device == "cpu" and num_threads:
        torch.set_num_threads(num_threads)
    mesh = init_distributed(rank, world_size, master_addr, master_port, device)
    torch.manual_seed(seed)
    return device, mesh
