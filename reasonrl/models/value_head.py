"""A value model for PPO: a causal LM's transformer backbone plus a scalar head, ``nn.Linear(hidden, 1)``.

The backbone is the base model of a Hugging Face causal LM (``AutoModel`` loads it from a causal-LM checkpoint,
dropping the LM head). ``response_values`` returns the value of the state *before* each response token, the
same positions whose logits give the token's log-prob, so values line up with log-probs and rewards.

On disk a value model is a Hugging Face directory of the backbone (``config.json`` + safetensors) plus
``value_head.safetensors`` and ``value_model.json`` (a marker); ``ValueModel.from_pretrained`` loads either such a
directory or a plain causal-LM checkpoint (the head then starts at zero: every value 0).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional

import torch
from torch import nn

from reasonrl.data.packing import PackedRows, pack_rows, trimmed_columns

HEAD_FILE = "value_head.safetensors"
MARKER_FILE = "value_model.json"
HEAD_PREFIX = "value_head."
BACKBONE_PREFIX = "model."


class ValueModel(nn.Module):
    """``backbone`` (a transformers base model returning ``last_hidden_state``) + a linear value head.

    The backbone is stored as ``self.model`` so that FSDP helpers find its decoder blocks at ``model.layers``
    (the same attribute path as in a Llama-style causal LM).
    """

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.model = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @property
    def config(self):
        """The backbone's transformers config."""
        return self.model.config

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Values [b, L] (float32) at every position of ``input_ids``."""
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False).last_hidden_state
        return self.value_head(hidden).float().squeeze(-1).clone()  # a fresh tensor, not a view (FSDP hooks)

    @classmethod
    def from_pretrained(cls, path: str, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False,
                        attn: str = "sdpa", device: str = "cpu") -> "ValueModel":
        """Load from a saved value model or from a causal-LM checkpoint (fresh zero head); ``attn`` as in
        ``loader.load_causal_lm``."""
        from transformers import AutoModel

        from .varlen_attention import prepared_attention

        backbone = AutoModel.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code,
                                             attn_implementation=prepared_attention(attn, device))
        model = cls(backbone, backbone.config.hidden_size).to(dtype)
        head_file = Path(path) / HEAD_FILE
        if head_file.exists():
            from safetensors.torch import load_file

            head = load_file(str(head_file))
            model.value_head.load_state_dict({k[len(HEAD_PREFIX):]: v.to(dtype) for k, v in head.items()})
        return model

    def save_pretrained(self, directory: str, state_dict: Optional[Dict[str, torch.Tensor]] = None) -> None:
        """Write the backbone as a Hugging Face directory plus the head. ``state_dict`` (full, unsharded; keys as
        in ``self.state_dict()``) overrides the module's own tensors, e.g. a gathered FSDP state dict."""
        from safetensors.torch import save_file

        state_dict = self.state_dict() if state_dict is None else state_dict
        unknown = [k for k in state_dict if not k.startswith((HEAD_PREFIX, BACKBONE_PREFIX))]
        if unknown:
            raise ValueError(f"unexpected value-model state keys: {unknown[:3]}")
        backbone_sd = {k[len(BACKBONE_PREFIX):]: v for k, v in state_dict.items() if k.startswith(BACKBONE_PREFIX)}
        head_sd = {k: v.detach().cpu().contiguous() for k, v in state_dict.items() if k.startswith(HEAD_PREFIX)}
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory, state_dict=backbone_sd, safe_serialization=True)
        save_file(head_sd, str(directory / HEAD_FILE))
        (directory / MARKER_FILE).write_text(json.dumps({"format": "reasonrl.value_model", "head": HEAD_FILE}))


def load_value_state_dict(directory: str) -> Dict[str, torch.Tensor]:
    """The full state dict (``ValueModel.state_dict()`` keys) of a value model saved with ``save_pretrained``."""
    from safetensors.torch import load_file

    directory = Path(directory)
    if not (directory / MARKER_FILE).exists():
        raise FileNotFoundError(f"{directory} is not a saved value model (no {MARKER_FILE})")
    state: Dict[str, torch.Tensor] = {}
    for f in sorted(directory.glob("*.safetensors")):
        if f.name == HEAD_FILE:
            continue
        state.update({BACKBONE_PREFIX + k: v for k, v in load_file(str(f)).items()})
    state.update(load_file(str(directory / HEAD_FILE)))
    return state


def response_values(model: ValueModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    position_ids: torch.Tensor, response_width: int) -> torch.Tensor:
    """Values [b, T] for the last ``response_width`` columns: entry t is the value of the prefix that ends just
    before response token t (position P + t - 1), like the logits that score token t."""
    values = model(input_ids, attention_mask, position_ids)
    return values[:, -response_width - 1:-1]


def packed_response_values(model: ValueModel, packed: PackedRows) -> torch.Tensor:
    """``response_values`` of a packed micro-batch (``reasonrl.data.packing.pack_rows``): values [rows, T], 0 at
    padding. The packed row goes in with ``attention_mask=None``, so the backbone's attention is block-diagonal."""
    values = model(packed.input_ids, None, packed.position_ids)
    return packed.unpack(values[0, packed.predict_index])


def micro_batch_values(model: ValueModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       position_ids: torch.Tensor, response_width: int, packed: bool = False) -> torch.Tensor:
    """Values [rows, T] of one rollout micro-batch, 0 at padding: packed into one row (``packed``), or padded with
    the columns that hold no valid token in any row trimmed off."""
    if packed:
        return packed_response_values(model, pack_rows(input_ids, attention_mask, position_ids, response_width))
    first, kept = trimmed_columns(attention_mask, response_width)
    end = input_ids.shape[1] - response_width + kept
    values = response_values(model, input_ids[:, first:end], attention_mask[:, first:end],
                             position_ids[:, first:end], kept)
    valid = attention_mask[:, -response_width:].bool()
    return torch.where(valid, torch.nn.functional.pad(values, (0, response_width - kept)), 0.0)
