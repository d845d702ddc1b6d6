"""FSDP2 helpers: shard a Hugging Face causal LM, and move full (unsharded) state dicts in and out."""
from __future__ import annotations

from typing import Dict, Tuple

import torch
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def decoder_layers(model) -> list:
    """The transformer blocks of a causal LM (each becomes its own FSDP2 unit)."""
    for attr in ("model.layers", "transformer.h", "gpt_neox.layers", "model.decoder.layers"):
        obj = model
        try:
            for part in attr.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return list(obj)
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")


def compile_decoder_layers(model) -> int:
    """Regional ``torch.compile``: compile each decoder layer in place (``Module.compile``, so parameter names and
    state-dict keys do not change), ``fullgraph=False`` so that anything Dynamo cannot trace runs eagerly. Call it
    before ``shard_model`` (compile, then ``fully_shard``, as torchtitan does): FSDP2's hooks then run around the
    compiled layer. All layers share one compiled graph (modules are graph inputs), and a sequence length not seen
    before recompiles once, after which Dynamo marks it dynamic. Returns the number of layers compiled."""
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile(fullgraph=False)
    return len(layers)


def shard_model(model, mesh, device: str, compute_dtype: torch.dtype) -> None:
    """``fully_shard`` every decoder layer, then the root; parameters stay fp32, compute in ``compute_dtype``."""
    model.to(device)
    kwargs = {"mesh": mesh}
    if compute_dtype != torch.float32:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)


def full_state_dict(model, optimizer) -> Tuple[Dict[str, torch.Tensor], dict]:
    """Full model and optimizer state dicts on CPU (a collective: every rank must call it)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)


def load_full_state_dict(model, optimizer, model_sd: Dict[str, torch.Tensor], optim_sd: dict) -> None:
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_sd, options=options)
    set_optimizer_state_dict(model, optimizer, optim_sd, options=options)


def clip_grad_norm(model, max_norm: float) -> float:
    """Clip the global gradient norm of ``model`` (0: measure only) and return it as a float; with FSDP2 the norm
    is a DTensor over all ranks, made full here."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)
