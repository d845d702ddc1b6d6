"""Padding-free attention without the flash-attn package: ``model.attn_implementation=varlen``.

A packed row (``reasonrl.data.packing``) holds several sequences end to end, with position ids that restart for each
one. Registered with transformers under ``VARLEN_ATTENTION``, ``varlen_attention_forward`` takes the sequence
boundaries from those position ids (``cu_seqlens_from_position_ids``: a sequence starts at each row's first token and
wherever a position is not the one before plus 1, the rule transformers' mask builders apply to packed rows) and
computes causal attention within each sequence only:

- on a GPU in bfloat16/float16 through torch's variable-length flash kernel, ``torch.nn.attention.varlen.varlen_attn``
  (every call goes through ``_varlen_causal``, which absorbs the differences between torch releases);
- elsewhere (the CPU has no kernel, float32 has none) one ``scaled_dot_product_attention`` per sequence: the reference
  semantics, and what the tests check the packed row against.

Padded rows (a 2D padding mask) and forwards with a KV cache keep transformers' sdpa: the registered mask function
builds sdpa's mask for them and returns None for rows without padding, whose boundaries the attention derives itself.
"""
from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from reasonrl.config.device_defaults import VARLEN_ATTENTION
from reasonrl.hardware import varlen_kernel_importable

_last_boundaries: list = [None, None, None]  # [position_ids, its version, (cu_seqlens, max_len)]


def cu_seqlens_from_position_ids(position_ids: Tensor) -> Tuple[Tensor, int]:
    """(cu_seqlens [S + 1] int32, longest sequence) of the rows of ``position_ids`` [b, n] laid end to end: a sequence
    starts at each row's first token and wherever a position is not the previous one plus 1.
    E.g. [[0, 1, 2, 0, 0, 1, 2, 3]] (lengths 3, 1, 4) -> ([0, 3, 4, 8], 4)."""
    rows, width = position_ids.shape
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    start_index = starts.reshape(-1).nonzero().flatten()
    end = torch.tensor([rows * width], device=position_ids.device)
    cu_seqlens = torch.cat([start_index, end]).to(torch.int32)
    return cu_seqlens, int((cu_seqlens[1:] - cu_seqlens[:-1]).max())


def _boundaries(position_ids: Tensor) -> Tuple[Tensor, int]:
    """``cu_seqlens_from_position_ids``, computed once per forward: every layer gets the same position ids tensor,
    and the longest length is a host sync."""
    if _last_boundaries[0] is position_ids and _last_boundaries[1] == position_ids._version:
        return _last_boundaries[2]
    found = cu_seqlens_from_position_ids(position_ids)
    _last_boundaries[:] = [position_ids, position_ids._version, found]
    return found


def _repeat_kv_heads(states: Tensor, times: int, head_dim: int) -> Tensor:
    """Repeat each KV head ``times`` times along ``head_dim`` (grouped-query attention without enable_gqa)."""
    return states if times == 1 else states.repeat_interleave(times, dim=head_dim)


@lru_cache(maxsize=1)
def _varlen_parameters() -> frozenset:
    from torch.nn.attention.varlen import varlen_attn

    return frozenset(inspect.signature(varlen_attn).parameters)


def _varlen_causal(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_len: int,
                   scale: Optional[float] = None) -> Tensor:
    """Causal attention within each sequence of ``cu_seqlens`` through ``varlen_attn``: q [N, Hq, D], k and v
    [N, Hkv, D] -> [N, Hq, D]. The one call of the kernel, for every torch release that has it: causal is
    ``window_size=(-1, 0)`` where the signature has it (``is_causal`` in older ones); grouped-query attention is
    ``enable_gqa`` where it exists (2.13), else the KV heads are repeated (2.11); ``scale`` is passed where accepted,
    else folded into the query (the kernel's default is 1/sqrt(D))."""
    from torch.nn.attention.varlen import varlen_attn

    params = _varlen_parameters()
    kwargs = {}
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0)
    else:
        kwargs["is_causal"] = True
    groups = q.shape[1] // k.shape[1]
    if groups > 1 and "enable_gqa" in params:
        kwargs["enable_gqa"] = True
    elif groups > 1:
        k, v = _repeat_kv_heads(k, groups, 1), _repeat_kv_heads(v, groups, 1)
    if scale is not None and "scale" in params:
        kwargs["scale"] = scale
    elif scale is not None:
        q = q * (scale * q.shape[-1] ** 0.5)
    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, **kwargs)


def _per_sequence_sdpa(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, scale: Optional[float]) -> Tensor:
    """The reference semantics of ``_varlen_causal`` (same shapes): one causal sdpa per sequence."""
    groups = q.shape[1] // k.shape[1]
    k, v = _repeat_kv_heads(k, groups, 1), _repeat_kv_heads(v, groups, 1)
    bounds = cu_seqlens.tolist()
    out = [F.scaled_dot_product_attention(q[s:e].transpose(0, 1), k[s:e].transpose(0, 1), v[s:e].transpose(0, 1),
                                          is_causal=True, scale=scale).transpose(0, 1)
           for s, e in zip(bounds[:-1], bounds[1:])]
    return torch.cat(out)


def uses_kernel(query: Tensor) -> bool:
    """Whether the varlen kernel runs for ``query``: on a GPU, in half precision, where torch has it."""
    return query.is_cuda and query.dtype in (torch.bfloat16, torch.float16) and varlen_kernel_importable()


@torch.compiler.disable
def varlen_attention_forward(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                             dropout: float = 0.0, scaling: Optional[float] = None,
                             sliding_window: Optional[int] = None, softcap: Optional[float] = None,
                             position_ids: Optional[Tensor] = None, **kwargs) -> Tuple[Tensor, None]:
    """transformers' attention interface: query [b, Hq, n, D], key/value [b, Hkv, m, D] -> ([b, n, Hq, D], None).
    Rows without a mask and without a cache (n == m): causal attention within each sequence of the position ids;
    anything else (a padding mask, a cache): transformers' sdpa. Runs eagerly inside compiled decoder layers
    (``actor.compile``): the boundaries are data-dependent (a host sync for the longest sequence)."""
    if attention_mask is not None or query.shape[2] != key.shape[2]:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      position_ids=position_ids, **kwargs)
    if sliding_window is not None or softcap is not None or (dropout and module.training):
        raise NotImplementedError(
            f"model.attn_implementation={VARLEN_ATTENTION}: {type(module).__name__} uses sliding-window attention, "
            "soft-capped logits or attention dropout, which it does not implement; set model.attn_implementation=sdpa")
    batch, heads, n, head_dim = query.shape
    if position_ids is None:
        position_ids = torch.arange(n, device=query.device).expand(batch, n)
    elif position_ids.shape[0] != batch:
        position_ids = position_ids.expand(batch, -1)
    cu_seqlens, max_len = _boundaries(position_ids)
    q, k, v = (t.transpose(1, 2).reshape(batch * n, t.shape[1], t.shape[-1]) for t in (query, key, value))
    if uses_kernel(query):
        out = _varlen_causal(q, k, v, cu_seqlens, max_len, scaling)
    else:
        out = _per_sequence_sdpa(q, k, v, cu_seqlens, scaling)
    return out.reshape(batch, n, heads, value.shape[-1]), None


def varlen_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
                attention_mask: Optional[Tensor] = None, **kwargs) -> Optional[Tensor]:
    """transformers' mask interface for ``VARLEN_ATTENTION``: None for rows without a padding mask or cache (the
    attention finds the sequences in the position ids), sdpa's mask otherwise."""
    if attention_mask is None and q_length == kv_length and not isinstance(kv_offset, Tensor) and kv_offset == 0:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, attention_mask=attention_mask, **kwargs)


def register_varlen_attention() -> None:
    """Register ``VARLEN_ATTENTION`` (the attention and its mask) with transformers; idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)
    AttentionMaskInterface.register(VARLEN_ATTENTION, varlen_mask)


def prepared_attention(name: str, device: str) -> str:
    """The ``attn_implementation`` to load a model with for ``model.attn_implementation=name`` on ``device``:
    ``auto`` resolved (``device_defaults.attn_implementation_for``), and the varlen implementation registered
    with transformers when it is the one, sdpa's wrapper without empty query rows when sdpa is."""
    from reasonrl.config.device_defaults import attn_implementation_for

    resolved = attn_implementation_for(name, device, varlen_kernel_importable())
    if resolved == VARLEN_ATTENTION:
        register_varlen_attention()
    elif resolved == "sdpa":  # padded rows: no query row without a key (sdpa_rows.py: the bf16 NaN's fix)
        from .sdpa_rows import register_sdpa_without_empty_rows

        register_sdpa_without_empty_rows()
    return resolved
