"""The actor's LoRA settings at work in a worker (``actor.lora``; docs/lora.md): how the model is wrapped, what the
optimizer holds, what a weight sync sends (the adapter alone, or the merged weights), and what a checkpoint writes.
With ``actor.lora.rank`` 0 every method gives what the worker does without LoRA, so the worker calls them always."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import torch

from reasonrl.models import lora as lora_lib

from . import weight_transfer
from .fsdp import iter_full_params

NamedTensor = Tuple[str, torch.Tensor]
ADAPTER_SUBDIR = "adapter"
"""A LoRA checkpoint's PEFT adapter directory (next to ``hf/``, the merged model)."""


class LoraSync:
    """``actor.lora`` of one worker (``cfg``: the run's config; ``base_model_path``: the base model's directory)."""

    def __init__(self, cfg, base_model_path: str) -> None:
        self.lora, self.base_model_path = cfg.actor.lora, base_model_path
        self.gradient_checkpointing = cfg.model.gradient_checkpointing
        self.on = self.lora.rank > 0
        self.adapter_only = self.on and not self.lora.merge_for_rollout

    # ------------------------------------------------------------------ model and optimizer
    @property
    def prepare(self):
        """What ``load_sharded_lm`` runs on the loaded actor before sharding: the peft wrap (None: LoRA off)."""
        if not self.on:
            return None
        return lambda model: lora_lib.wrap_with_lora(model, self.lora, self.gradient_checkpointing)

    def trainable(self, model) -> Optional[List[torch.nn.Parameter]]:
        """The parameters the optimizer holds: the adapters (None: LoRA off, all of them)."""
        return lora_lib.trainable_parameters(model) if self.on else None

    # ------------------------------------------------------------------ weight sync
    def _transform(self, named: Iterable[NamedTensor], compute_dtype: torch.dtype) -> Iterator[NamedTensor]:
        if self.adapter_only:
            return lora_lib.adapter_tensors(named)
        if self.on:
            return lora_lib.merged_tensors(named, lora_lib.scaling(self.lora), compute_dtype)
        return iter(named)

    def sync_tensors(self, model, device: str, compute_dtype: torch.dtype) -> Iterator[NamedTensor]:
        """What a sync sends, full tensors one at a time (a collective: every rank iterates): without LoRA every
        parameter in ``compute_dtype``; adapter-only, the adapter's tensors in fp32 under PEFT's saved names (the base
        is not gathered); merged, every weight with the adapters merged in, in ``compute_dtype``."""
        if self.adapter_only:
            return self._transform(iter_full_params(model, device, torch.float32, lora_lib.is_adapter_param),
                                   compute_dtype)
        if self.on:
            return self._transform(iter_full_params(model, device, torch.float32), compute_dtype)
        return iter_full_params(model, device, compute_dtype)

    def specs(self, model, compute_dtype: torch.dtype) -> List[weight_transfer.ParamSpec]:
        """The specs of ``sync_tensors``, in its order (computed on meta tensors: nothing is gathered)."""
        if not self.on:
            return weight_transfer.param_specs(model.named_parameters(), compute_dtype)
        named = ((n, torch.empty(p.shape, dtype=torch.float32, device="meta")) for n, p in model.named_parameters()
                 if not self.adapter_only or lora_lib.is_adapter_param(n))
        return [weight_transfer.ParamSpec(name, tuple(t.shape), str(t.dtype).replace("torch.", ""))
                for name, t in self._transform(named, compute_dtype)]

    def adapter_config(self, adapter_names: Iterable[str]) -> dict:
        """The adapter's ``adapter_config.json`` (``models.lora.adapter_config_for``)."""
        return lora_lib.adapter_config_for(self.lora, adapter_names, self.base_model_path)

    # ------------------------------------------------------------------ checkpoints
    def export(self, directory: Path, model_sd: Dict[str, torch.Tensor], tokenizer) -> Dict[str, torch.Tensor]:
        """Rank 0, LoRA on: write ``<directory>/adapter/`` (the PEFT adapter, with the tokenizer) and return the
        merged model's state dict (what ``hf/`` holds: a plain Hugging Face model)."""
        adapter = {lora_lib.adapter_name(k): v for k, v in model_sd.items() if lora_lib.is_adapter_param(k)}
        target = Path(directory) / ADAPTER_SUBDIR
        lora_lib.save_adapter_dir(target, adapter, self.adapter_config(adapter), self.base_model_path)
        tokenizer.save_pretrained(target)
        return dict(lora_lib.merged_tensors(model_sd.items(), lora_lib.scaling(self.lora), torch.float32))

    def adapter_state(self, directory: Path, model) -> Dict[str, torch.Tensor]:
        """The adapter of a checkpoint under the live model's parameter names (to load with ``strict=False``: the
        base weights are frozen and come from the base model)."""
        from safetensors.torch import load_file

        source = Path(directory) / ADAPTER_SUBDIR / "adapter_model.safetensors"
        if not source.is_file():
            raise FileNotFoundError(f"{directory} has no {ADAPTER_SUBDIR}/adapter_model.safetensors: not a LoRA "
                                    f"checkpoint (actor.lora.rank={self.lora.rank})")
        saved = load_file(str(source))
        live = {lora_lib.adapter_name(n): n for n, _ in model.named_parameters() if lora_lib.is_adapter_param(n)}
        missing = sorted(set(live) - set(saved))
        if missing or set(saved) - set(live):
            raise ValueError(f"{source}: the adapter does not fit the actor (missing {missing[:3]}, unexpected "
                             f"{sorted(set(saved) - set(live))[:3]}): another actor.lora.rank or target_modules?")
        return {live[n]: t for n, t in saved.items()}
