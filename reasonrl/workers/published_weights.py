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
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Tuple

import numpy as np
import torch

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


def pack(named: Iterable[NamedTensor]) -> PublishedWeights:
    """CPU copies of ``named`` (any device, any dtype) as byte arrays."""
    names, dtypes, shapes, data = [], [], [], []
    for name, tensor in named:
        flat = tensor.detach().reshape(-1).to("cpu", copy=True).contiguous()
        names.append(name)
        dtypes.append(tensor.dtype)
        shapes.append(tuple(tensor.shape))
        data.append(flat.view(torch.uint8).numpy())
    return PublishedWeights(tuple(names), tuple(dtypes), tuple(shapes), tuple(data))


def unpack(published: PublishedWeights) -> List[NamedTensor]:
    """The named tensors, views of ``published.data`` (no copy; read-only when it came from the object store)."""
    with warnings.catch_warnings():  # torch warns that a read-only array makes a tensor it must not write
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return [(name, torch.from_numpy(array).view(dtype).reshape(shape) if array.size
                 else torch.empty(shape, dtype=dtype))  # no bytes: torch cannot view an empty array as another dtype
                for name, dtype, shape, array in zip(published.names, published.dtypes, published.shapes,
                                                     published.data)]


def put(named: Iterable[NamedTensor]) -> Dict[str, Any]:
    """``pack(named)`` put into Ray's object store by this process: ``{"ref": [ObjectRef], "bytes": n}`` (the ref in a
    list, so a Ray call returning this hands it over unresolved)."""
    import ray

    published = pack(named)
    return {"ref": [ray.put(published)], "bytes": published.nbytes}
