"""LoRA adapters on a causal LM through peft (``actor.lora``; docs/lora.md): which projections get adapters, the
wrapped model, and the names and tensors a weight sync, a checkpoint and an export move.

Names. peft's live parameter names carry its wrapper and the adapter's name
(``base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight``, the frozen weight
``...q_proj.base_layer.weight``). Three forms are used: the plain Hugging Face name of a base weight
(``hf_name``: ``model.layers.0.self_attn.q_proj.weight``), the adapter's name in PEFT's saved format
(``adapter_name``: ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``, what ``adapter_model.safetensors``
holds and vLLM reads), and the live name itself.
"""
from __future__ import annotations

import re
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

NamedTensor = Tuple[str, torch.Tensor]

PEFT_PREFIX = "base_model.model."
"""What peft puts in front of the wrapped model's own parameter names."""
ADAPTER = "default"
"""The name of the one adapter reasonrl trains (peft's default)."""
_LORA_PART = re.compile(r"\.(lora_[AB])\.[^.]+\.")


class LoraTargetError(ValueError):
    """``actor.lora.target_modules`` names a module the model does not have; the message lists the candidates."""


def _decoder_layers(model: nn.Module) -> List[nn.Module]:
    from .loader import decoder_layers  # the same blocks FSDP2 shards

    return decoder_layers(model)


def linear_module_names(model: nn.Module) -> List[str]:
    """The last name part of every ``nn.Linear`` inside the model's decoder layers (its attention and MLP
    projections, e.g. q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj), sorted: the default targets
    and the candidates an error lists."""
    names = set()
    for layer in _decoder_layers(model):
        for name, module in layer.named_modules():
            if isinstance(module, nn.Linear):
                names.add(name.rsplit(".", 1)[-1])
    return sorted(names)


def resolve_target_modules(model: nn.Module, requested: Sequence[str]) -> List[str]:
    """``requested`` checked against the model (empty: every candidate); raises ``LoraTargetError`` naming each
    unknown module and listing the candidates."""
    return _checked_targets(type(model).__name__, linear_module_names(model), requested)


def _checked_targets(architecture: str, candidates: List[str], requested: Sequence[str]) -> List[str]:
    if not candidates:
        raise LoraTargetError(f"{architecture} has no linear projections in its decoder layers to adapt")
    unknown = [n for n in requested if n not in candidates]
    if unknown:
        raise LoraTargetError(f"actor.lora.target_modules: {', '.join(unknown)} not in {architecture}'s "
                              f"decoder layers; candidates: {', '.join(candidates)}")
    return list(requested) if requested else candidates


def check_target_modules(model_path: str, requested: Sequence[str], trust_remote_code: bool = False) -> List[str]:
    """``resolve_target_modules`` before anything loads: the model is built from its ``config.json`` on the meta
    device (its module tree with no weights read or allocated), so a target it does not have fails in about a
    second, not after the workers loaded the weights. The workers check again on the real model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return resolve_target_modules(model, requested)


def peft_config(lora, target_modules: Sequence[str]):
    """peft's ``LoraConfig`` for the ``actor.lora`` section and the resolved targets."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                          target_modules=list(target_modules), bias="none", task_type="CAUSAL_LM")


def wrap_with_lora(model: nn.Module, lora, gradient_checkpointing: bool = False) -> nn.Module:
    """``model`` with LoRA adapters (peft ``get_peft_model``): only the adapters require grad; B starts at zero, so
    the wrapped model computes what the base does until it trains. With gradient checkpointing the embeddings'
    output requires grad (the base is frozen, and a checkpointed block needs a differentiable input)."""
    from peft import get_peft_model

    config = peft_config(lora, resolve_target_modules(model, lora.target_modules))
    if gradient_checkpointing:
        model.enable_input_require_grads()
    return get_peft_model(model, config)


def is_lora_model(model: nn.Module) -> bool:
    """Whether ``model`` is peft-wrapped."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def is_adapter_param(name: str) -> bool:
    """Whether a live parameter name is an adapter's (lora_A / lora_B)."""
    return ".lora_A." in name or ".lora_B." in name


def adapter_name(live_name: str) -> str:
    """PEFT's saved name of a live adapter parameter (the adapter's own name dropped)."""
    return _LORA_PART.sub(r".\1.", live_name)


def hf_name(live_name: str) -> str:
    """The plain Hugging Face name of a live base parameter (peft's prefix and ``.base_layer`` dropped)."""
    name = live_name[len(PEFT_PREFIX):] if live_name.startswith(PEFT_PREFIX) else live_name
    return name.replace(".base_layer.", ".")


def trainable_parameters(model: nn.Module) -> List[nn.Parameter]:
    """The parameters the optimizer holds: those that require grad (with LoRA, the adapters only)."""
    return [p for p in model.parameters() if p.requires_grad]


def scaling(lora) -> float:
    """The factor of B A in the merged weight: alpha / r."""
    return lora.alpha / lora.rank


def adapter_tensors(named_full: Iterable[NamedTensor]) -> Iterator[NamedTensor]:
    """The adapter tensors of a stream of (live name, full tensor), under PEFT's saved names."""
    for name, tensor in named_full:
        if is_adapter_param(name):
            yield adapter_name(name), tensor


def merged_tensors(named_full: Iterable[NamedTensor], scale: float, dtype: torch.dtype) -> Iterator[NamedTensor]:
    """(Hugging Face name, W + scale * B A) for every adapted weight and (name, W) for the rest, in ``dtype``, from a
    stream of (live name, full fp32 tensor) in ``named_parameters`` order (a module's base weight, then its A, then
    its B). Holds at most one module's tensors at a time."""
    pending: Dict[str, Dict[str, torch.Tensor]] = {}
    for name, tensor in named_full:
        if ".base_layer.weight" in name:
            pending.setdefault(name.replace(".base_layer.weight", ""), {})["W"] = tensor
        elif is_adapter_param(name):
            module = name.split(".lora_")[0]
            pending.setdefault(module, {})["A" if ".lora_A." in name else "B"] = tensor
        else:
            yield hf_name(name), tensor.to(dtype)
            continue
        module = name.split(".lora_")[0] if is_adapter_param(name) else name.replace(".base_layer.weight", "")
        parts = pending[module]
        if len(parts) == 3:
            del pending[module]
            merged = parts["W"].float() + scale * (parts["B"].float() @ parts["A"].float())
            yield hf_name(module + ".weight"), merged.to(dtype)
    if pending:
        raise RuntimeError(f"LoRA merge: modules with missing parts: {sorted(pending)[:5]}")


def adapter_config_dict(model: nn.Module) -> dict:
    """The peft adapter config of a wrapped model as ``adapter_config.json`` holds it."""
    config = model.peft_config[ADAPTER]
    return config.to_dict()


def save_adapter_dir(directory, adapter_sd: Dict[str, torch.Tensor], config: dict,
                     base_model_path: Optional[str] = None) -> None:
    """Write a PEFT adapter directory: ``adapter_model.safetensors`` (PEFT's saved names) and
    ``adapter_config.json`` (``base_model_name_or_path``: the base, when given)."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = dict(config)
    if base_model_path is not None:
        config["base_model_name_or_path"] = str(base_model_path)
    for key, value in list(config.items()):
        if isinstance(value, set):
            config[key] = sorted(value)
    save_file({k: v.detach().contiguous().cpu() for k, v in adapter_sd.items()},
              str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2, default=str))


def is_adapter_dir(path) -> bool:
    """Whether ``path`` is a PEFT adapter directory (``adapter_config.json``)."""
    from pathlib import Path

    return (Path(path) / "adapter_config.json").is_file()


def adapter_base_path(path) -> str:
    """The base model an adapter directory names (``base_model_name_or_path``)."""
    import json
    from pathlib import Path

    base = json.loads((Path(path) / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{path}/adapter_config.json names no base model (base_model_name_or_path)")
    return base


def adapter_config_for(lora, adapter_names: Iterable[str], base_model_path: Optional[str] = None) -> dict:
    """The ``adapter_config.json`` of an adapter with these tensors (PEFT's saved names): the ``actor.lora`` settings
    and the target modules the names hold. The actor and every receiver of its adapter build it the same way, so the
    config never travels with the tensors."""
    targets = sorted({n.split(".lora_")[0].rsplit(".", 1)[-1] for n in adapter_names if is_adapter_param(n)})
    config = peft_config(lora, targets).to_dict()
    config = {k: (sorted(v) if isinstance(v, set) else v) for k, v in config.items()}
    if base_model_path is not None:
        config["base_model_name_or_path"] = str(base_model_path)
    return config


def merged_model_dir(adapter_dir, dtype: torch.dtype = torch.float32) -> str:
    """A Hugging Face model directory holding the base of ``adapter_dir`` with the adapter merged in (built once,
    cached under the reasonrl cache by the adapter's content): how evaluation runs an adapter on any engine."""
    import hashlib
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from peft import PeftModel

    from .loader import cache_root, load_causal_lm, load_tokenizer, resolve_model_path

    adapter_dir = Path(adapter_dir)
    digest = hashlib.sha256()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        digest.update((adapter_dir / name).read_bytes())
    target = cache_root() / "merged_adapters" / digest.hexdigest()[:16]
    if (target / "config.json").is_file():
        return str(target)
    base = resolve_model_path(adapter_base_path(adapter_dir))
    merged = PeftModel.from_pretrained(load_causal_lm(base, dtype), str(adapter_dir)).merge_and_unload()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp", dir=target.parent))
    merged.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer_source = adapter_dir if (adapter_dir / "tokenizer_config.json").is_file() else base
    load_tokenizer(str(tokenizer_source)).save_pretrained(str(tmp))
    try:
        os.rename(tmp, target)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)
