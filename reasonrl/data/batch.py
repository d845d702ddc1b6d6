"""Batch: the container passed between the controller and the workers.

Tensors share the first dimension (rows); ``meta`` holds per-row Python objects (lists of the same length).
It pickles cleanly across Ray and splits/concatenates along rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Union

import torch


@dataclass
class Batch:
    tensors: Dict[str, torch.Tensor] = field(default_factory=dict)
    meta: Dict[str, List[Any]] = field(default_factory=dict)

    def __len__(self) -> int:
        for t in self.tensors.values():
            return int(t.shape[0])
        for v in self.meta.values():
            return len(v)
        return 0

    def __getitem__(self, key: str) -> Union[torch.Tensor, List[Any]]:
        return self.tensors[key] if key in self.tensors else self.meta[key]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.meta

    def __setitem__(self, key: str, value: Union[torch.Tensor, List[Any]]) -> None:
        if len(self) and len(value) != len(self):
            raise ValueError(f"{key}: {len(value)} rows, batch has {len(self)}")
        if isinstance(value, torch.Tensor):
            self.tensors[key] = value
        else:
            self.meta[key] = list(value)

    def select(self, index: Union[Sequence[int], torch.Tensor]) -> "Batch":
        idx = torch.as_tensor(index, dtype=torch.long)
        pos = idx.tolist()
        return Batch({k: v[idx] for k, v in self.tensors.items()},
                     {k: [v[i] for i in pos] for k, v in self.meta.items()})

    def chunk(self, parts: int) -> List["Batch"]:
        """Split into ``parts`` equal pieces (the row count must divide evenly: every rank gets the same work)."""
        n = len(self)
        if n % parts:
            raise ValueError(f"cannot split {n} rows into {parts} equal parts")
        size = n // parts
        return [self.select(range(i * size, (i + 1) * size)) for i in range(parts)]

    def split(self, size: int) -> List["Batch"]:
        """Consecutive pieces of at most ``size`` rows."""
        return [self.select(range(i, min(i + size, len(self)))) for i in range(0, len(self), size)]

    @staticmethod
    def concat(batches: Sequence["Batch"]) -> "Batch":
        batches = [b for b in batches if b is not None]
        if not batches:
            return Batch()
        first = batches[0]
        tensors = {}
        for k in first.tensors:
            parts = [b.tensors[k] for b in batches]
            width = max(p.shape[1] for p in parts) if parts[0].dim() > 1 else None
            if width is not None and any(p.shape[1] != width for p in parts):
                raise ValueError(f"{k}: widths differ across parts; pad before concatenating")
            tensors[k] = torch.cat(parts)
        meta = {k: [x for b in batches for x in b.meta[k]] for k in first.meta}
        return Batch(tensors, meta)

    def to(self, device: Union[str, torch.device]) -> "Batch":
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, dict(self.meta))

    def union(self, other: "Batch") -> "Batch":
        """A batch with this batch's fields plus ``other``'s (same rows)."""
        if len(other) and len(self) and len(other) != len(self):
            raise ValueError(f"union of {len(self)} and {len(other)} rows")
        return Batch({**self.tensors, **other.tensors}, {**self.meta, **other.meta})
