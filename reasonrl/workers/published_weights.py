"""The weights a fleet publishes (``fleet.enabled``): actor rank 0's full parameters as byte arrays in Ray's object
store, put there by the actor itself, read by every replica without a copy.

Why this form: a list of torch tensors returned through Ray is pickled tensor by tensor, then put again by the
driver and unpickled by each replica, four copies of every byte (9.65 s for 1 GiB of bf16 on the 2-core development
machine against 0.78 s this way: ``benchmarks/results/publish_path.json``; 12.6-22.1 s a step for the 1.5B shape on
an H100, docs/async.md). numpy arrays travel as out-of-band buffers instead: ``ray.put`` copies each once into shared
memory and ``ray.get`` maps them read-only, so after the gather's copy to the host the put is the only copy. bfloat16
has no numpy dtype, so every tensor travels as its bytes (``uint8``) with its dtype and shape beside it.

The tensors ``unpack`` returns share the object store's read-only memory: the engines copy them into their own
parameters (``update_weights``: a device copy or ``copy_``) and never write to them.

The copy to the host lands in a ``HostArena`` when the actor gives one (``gather_weights``: sized once from the
specs, page-locked where CUDA is): every tensor's copy is then issued without waiting and the device is waited for
once, instead of one pageable copy and one wait per tensor. The arena is reused by the next publish, which is safe
because ``ray.put`` has copied its bytes into the store before ``put`` returns.
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .host_memory import HostArena, aligned, storage_bytes

NamedTensor = Tuple[str, torch.Tensor]


@dataclass(frozen=True)
class PublishedWeights:
    """Named tensors as bytes: ``data[i]`` holds tensor ``names[i]`` of ``dtypes[i]`` and ``shapes[i]``."""

    names: Tuple[str, ...]
    dtypes: Tuple[torch.dtype, ...]
    shapes: Tuple[Tuple[int, ...], ...]
    data: Tuple[np.ndarray, ...]

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.data)


def staged_bytes(shapes_and_dtypes: Sequence[Tuple[Sequence[int], torch.dtype]]) -> int:
    """The arena ``pack`` needs for tensors of these shapes and dtypes: each flat and ``ALIGN``-aligned, as
    ``HostArena.take`` hands it out."""
    return sum(aligned(storage_bytes((math.prod(shape),), (1,), dtype)) for shape, dtype in shapes_and_dtypes)


def pack(named: Iterable[NamedTensor], arena: Optional[HostArena] = None) -> PublishedWeights:
    """Host copies of ``named`` (any device, any dtype) as byte arrays: in ``arena`` when given (the caller has
    called ``arena.begin`` with ``staged_bytes``; a tensor that does not fit gets a copy of its own), else each
    in a new allocation. The device copies into the arena run without waiting; the device is waited for once."""
    names, dtypes, shapes, data = [], [], [], []
    devices = set()
    for name, tensor in named:
        flat = tensor.detach().reshape(-1)
        host = arena.take((flat.numel(),), (1,), flat.dtype) if arena is not None else None
        if host is None:
            host = flat.to("cpu", copy=True).contiguous()
        else:
            host.copy_(flat, non_blocking=flat.device.type == "cuda")
            if flat.device.type == "cuda":
                devices.add(flat.device)
        names.append(name)
        dtypes.append(tensor.dtype)
        shapes.append(tuple(tensor.shape))
        data.append(host.view(torch.uint8).numpy() if host.numel() else np.zeros(0, dtype=np.uint8))
    for device in devices:  # the copies were issued on each device's current stream, in order
        torch.cuda.current_stream(device).synchronize()
    return PublishedWeights(tuple(names), tuple(dtypes), tuple(shapes), tuple(data))


def unpack(published: PublishedWeights) -> List[NamedTensor]:
    """The named tensors, views of ``published.data`` (no copy; read-only when it came from the object store)."""
    with warnings.catch_warnings():  # torch warns that a read-only array makes a tensor it must not write
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return [(name, torch.from_numpy(array).view(dtype).reshape(shape) if array.size
                 else torch.empty(shape, dtype=dtype))  # no bytes: torch cannot view an empty array as another dtype
                for name, dtype, shape, array in zip(published.names, published.dtypes, published.shapes,
                                                     published.data)]


def put(named: Iterable[NamedTensor], arena: Optional[HostArena] = None) -> Dict[str, Any]:
    """``pack(named, arena)`` put into Ray's object store by this process: ``{"ref": [ObjectRef], "bytes": n,
    "copy_s": s, "put_s": s}`` (the ref in a list, so a Ray call returning this hands it over unresolved; ``copy_s``:
    gathering and copying to the host, ``put_s``: the copy into the store)."""
    import ray

    start = time.perf_counter()
    published = pack(named, arena)
    copied = time.perf_counter()
    ref = ray.put(published)
    return {"ref": [ref], "bytes": published.nbytes, "copy_s": copied - start,
            "put_s": time.perf_counter() - copied}
