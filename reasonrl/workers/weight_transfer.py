"""Weights from the actor to rollout workers on other devices (``trainer.mode=async``).

A standalone process group, made from its own ``TCPStore`` (no default group: the actor ranks' FSDP group and the
rollout workers never share one), spans actor rank 0 (group rank 0) and the rollout workers (group ranks 1..R): NCCL
on GPU, gloo on CPU. Actor rank 0 hosts the store. A sync sends the actor's full parameters in buckets
(``reasonrl.rollout.weight_sync.iter_buckets``): each bucket is packed into one flat byte buffer and broadcast from
rank 0; each receiver unpacks it into views and hands them to its engine's ``update_weights``. Both sides cut the
buckets from the same parameter list (``ParamSpec``), so they agree on every bucket's layout without sending it.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Iterable, Iterator, List, Sequence, Tuple

import torch
import torch.distributed as dist

from reasonrl.rollout.weight_sync import iter_buckets, normalize_param_name, tensor_nbytes

NamedTensor = Tuple[str, torch.Tensor]


@dataclass(frozen=True)
class ParamSpec:
    """What a receiver needs to know of one parameter to unpack it."""

    name: str
    """Hugging Face parameter name (wrapper prefixes removed)."""
    shape: Tuple[int, ...]
    dtype: str
    """``str(torch.dtype)`` without the ``torch.`` prefix, e.g. ``bfloat16``."""

    def empty(self, device: str = "meta") -> torch.Tensor:
        return torch.empty(self.shape, dtype=getattr(torch, self.dtype), device=device)


def param_specs(named_params: Iterable[Tuple[str, torch.Tensor]], dtype: torch.dtype) -> List[ParamSpec]:
    """The specs of the tensors a sync will send: the actor's parameters in ``dtype`` (shapes of the full tensors)."""
    return [ParamSpec(normalize_param_name(name), tuple(p.shape), str(dtype).replace("torch.", ""))
            for name, p in named_params]


def open_store(port: int = 0) -> Tuple[dist.TCPStore, str, int]:
    """Start the group's store on this host (actor rank 0); ``port`` 0 lets the OS pick. Returns (store, ip, port)."""
    import ray

    store = dist.TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False, timeout=timedelta(minutes=10))
    return store, ray.util.get_node_ip_address(), store.port


def join_group(store: dist.Store, rank: int, size: int, device: str, timeout_s: float):
    """This process's handle on the transfer group (all ``size`` members call it together)."""
    prefixed = dist.PrefixStore("reasonrl_weight_transfer", store)
    timeout = timedelta(seconds=timeout_s)
    if device == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, size, options)
    return dist.ProcessGroupGloo(prefixed, rank, size, timeout)


def connect_store(host: str, port: int) -> dist.TCPStore:
    return dist.TCPStore(host, port, is_master=False, timeout=timedelta(minutes=10))


def _broadcast(group, buffer: torch.Tensor) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([buffer], options).wait()


ALIGN = 16
"""Each tensor starts at a multiple of this many bytes in a packed bucket (so every dtype can be viewed in place)."""


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def packed_size(specs: Sequence[ParamSpec]) -> int:
    """Bytes of the packed buffer of a bucket with these specs."""
    return sum(_aligned(tensor_nbytes(s.empty())) for s in specs)


def pack(bucket: Sequence[NamedTensor]) -> torch.Tensor:
    """One flat uint8 buffer holding the bucket's tensors back to back, each at an ``ALIGN``-byte boundary."""
    parts = []
    for _, t in bucket:
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
        parts.append(raw)
        pad = _aligned(raw.numel()) - raw.numel()
        if pad:
            parts.append(raw.new_zeros(pad))
    return torch.cat(parts)


def unpack(buffer: torch.Tensor, specs: Sequence[ParamSpec]) -> List[NamedTensor]:
    """Views into ``buffer`` with the specs' names, shapes and dtypes (the inverse of ``pack``)."""
    out, offset = [], 0
    for spec in specs:
        size = tensor_nbytes(spec.empty())
        out.append((spec.name, buffer[offset:offset + size].view(getattr(torch, spec.dtype)).reshape(spec.shape)))
        offset += _aligned(size)
    if offset != buffer.numel():
        raise ValueError(f"bucket of {buffer.numel()} bytes does not match its specs ({offset} bytes)")
    return out


def spec_buckets(specs: Sequence[ParamSpec], bucket_bytes: int) -> Iterator[List[ParamSpec]]:
    """The receiver's view of ``iter_buckets``: the same grouping, computed from the specs alone."""
    by_name = {s.name: s for s in specs}
    for bucket in iter_buckets(((s.name, s.empty()) for s in specs), bucket_bytes):
        yield [by_name[name] for name, _ in bucket]


def send(group, named_tensors: Iterable[NamedTensor], specs: Sequence[ParamSpec], bucket_bytes: int) -> int:
    """Rank 0: broadcast the tensors, bucket by bucket; returns the bytes sent. The tensors must come in the order
    and with the names, shapes and dtypes of ``specs``."""
    sent = 0
    expected = iter(specs)
    for bucket in iter_buckets(((normalize_param_name(n), t) for n, t in named_tensors), bucket_bytes):
        for (name, tensor), spec in zip(bucket, expected):
            if (name, tuple(tensor.shape), str(tensor.dtype).replace("torch.", "")) != (spec.name, spec.shape,
                                                                                         spec.dtype):
                raise ValueError(f"weight transfer: {name} {tuple(tensor.shape)} {tensor.dtype} does not match its "
                                 f"spec {spec}")
        buffer = pack(bucket)
        _broadcast(group, buffer)
        sent += buffer.numel()
    return sent


def receive(group, specs: Sequence[ParamSpec], bucket_bytes: int, device: str) -> Iterator[List[NamedTensor]]:
    """Ranks 1..R: yield each received bucket as (name, tensor) views into a buffer of its own."""
    for bucket in spec_buckets(specs, bucket_bytes):
        buffer = torch.empty(packed_size(bucket), dtype=torch.uint8, device=device)
        _broadcast(group, buffer)
        yield unpack(buffer, bucket)
