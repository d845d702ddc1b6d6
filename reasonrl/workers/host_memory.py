"""``HostArena``: exactly sized, page-locked host memory for one model's (or one optimizer's) offloaded tensors.

Why not ``torch.empty(..., pin_memory=True)`` per tensor: torch's pinned-memory allocator rounds every request up to
the next power of two (``CachingHostAllocator``, pytorch/pytorch#150517), so offloading Qwen2.5-7B's fp32 shards
pinned ~54 GiB for 28.4 GiB of parameters (an MLP weight of 272 MB takes 512 MiB, an embedding of 2.2 GB takes
4 GiB); with the reference and vLLM's sleeping weights that was the host OOM of the ninth GPU session
(benchmarks/README.md). An arena is one ordinary host allocation of the exact size, page-locked once with
``cudaHostRegister``, carved into 512-byte aligned views; it is reused by every later offload of the same model.

The life cycle (``Offloader`` keeps it): ``begin(total)`` at an offload, when none of the model's tensors lives in
the arena (they are all on the device), then ``take`` per tensor; the views stay valid until the next ``begin``.
So a tensor an offload put in the arena must not be kept past the model's next offload (a checkpoint's state dict
is a copy: it is not affected). When there is no CUDA (a CPU-only build) the arena is plain host memory."""
from __future__ import annotations

import logging
import math
from typing import Optional, Sequence

import torch

log = logging.getLogger(__name__)

ALIGN = 512
"""Bytes: each view starts at a multiple of this (any dtype's alignment, and CUDA's preferred copy alignment)."""


def storage_bytes(size: Sequence[int], stride: Sequence[int], dtype: torch.dtype) -> int:
    """Bytes a tensor of this size and stride spans in its storage (``empty_strided``'s need; 0 when empty)."""
    if any(s == 0 for s in size):
        return 0
    elements = 1 + sum((s - 1) * st for s, st in zip(size, stride))
    return elements * torch.empty((), dtype=dtype).element_size()


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of ``ALIGN``."""
    return int(math.ceil(nbytes / ALIGN) * ALIGN)


class HostArena:
    """One exactly sized host buffer (page-locked where CUDA is available), handed out as views (module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._buffer: Optional[torch.Tensor] = None
        self._registered = False
        self._offset = 0
        self.misses = 0
        """Tensors that did not fit (``take`` returned None): the caller allocated them elsewhere."""

    @property
    def capacity(self) -> int:
        """Bytes the arena holds (0 before the first ``begin``)."""
        return 0 if self._buffer is None else self._buffer.numel()

    @property
    def used(self) -> int:
        """Bytes handed out since the last ``begin``."""
        return self._offset

    @property
    def pinned(self) -> bool:
        """Whether the buffer is page-locked (``cudaHostRegister`` succeeded)."""
        return self._registered

    def begin(self, total_bytes: int) -> None:
        """Start an offload that will ``take`` at most ``total_bytes`` (sum of ``aligned`` sizes): every earlier view
        is given up. A larger need replaces the buffer (an old view still referenced elsewhere keeps the old memory
        alive, unpinned)."""
        if total_bytes < 0:
            raise ValueError(f"{self.name}: total_bytes must be >= 0, got {total_bytes}")
        if total_bytes > self.capacity:
            self._release()
            self._buffer = torch.empty(total_bytes, dtype=torch.uint8)
            self._registered = _register(self._buffer, self.name)
        self._offset = 0

    def take(self, size: Sequence[int], stride: Sequence[int], dtype: torch.dtype) -> Optional[torch.Tensor]:
        """An uninitialised view of this size, stride and dtype in the arena, or None when it does not fit."""
        need = storage_bytes(size, stride, dtype)
        if self._buffer is None or self._offset + aligned(need) > self.capacity:
            self.misses += 1
            return None
        start, self._offset = self._offset, self._offset + aligned(need)
        if need == 0:
            return torch.empty_strided(size, stride, dtype=dtype)
        return self._buffer[start:start + need].view(dtype).as_strided(size, stride)

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s data lies in the arena (handed out since the last ``begin``)."""
        if self._buffer is None or tensor.device.type != "cpu":
            return False
        base = self._buffer.data_ptr()
        return base <= tensor.data_ptr() < base + self._offset

    def _release(self) -> None:
        if self._buffer is not None and self._registered:
            torch.cuda.synchronize()  # no copy may still read or write the pages
            torch.cuda.cudart().cudaHostUnregister(self._buffer.data_ptr())
        self._buffer, self._registered = None, False

    def close(self) -> None:
        """Give the memory back (views still referenced keep it alive, unpinned)."""
        self._release()
        self._offset = 0


def _register(buffer: torch.Tensor, name: str) -> bool:
    """Page-lock ``buffer`` for asynchronous copies; False (pageable, slower copies) without CUDA or on failure."""
    if buffer.numel() == 0 or not torch.cuda.is_available():
        return False
    err = torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), buffer.numel(), 0)
    if int(err) != 0:
        log.warning("%s: cudaHostRegister of %.2f GiB failed (cudaError %d): offloaded copies stay pageable",
                    name, buffer.numel() / 2**30, int(err))
        return False
    return True
