"""What a run needs to know of its model before anything loads: ``ModelFacts``, read from its ``config.json`` as
JSON (no torch, no weights). The plan's second step (``RunPlan.with_model``), the memory plan and the doctor read it."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from .load import ConfigError

CONTEXT_LENGTH_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""``config.json`` fields that state a model's context length, in the order they are read."""


@dataclass(frozen=True)
class ModelFacts:
    """The model's numbers from its ``config.json`` (0 or None where the file does not say)."""

    path: str
    """The model's directory."""
    name: str = ""
    """How the config names the model (``model.path``, a hub id or a directory; the directory when not given)."""
    layers: int = 0
    """``num_hidden_layers``."""
    hidden: int = 0
    """``hidden_size``."""
    heads: int = 0
    """``num_attention_heads``."""
    kv_heads: int = 0
    """``num_key_value_heads`` (the attention heads when not stated)."""
    vocab: int = 0
    """``vocab_size``."""
    max_positions: Optional[int] = None
    """The context length (the first of ``CONTEXT_LENGTH_FIELDS`` stated; None: not stated, not checked)."""
    config: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The whole ``config.json`` (empty when the directory has none): the memory plan's ``ModelShape`` reads it."""

    @classmethod
    def from_config_json(cls, path: str, config: Mapping[str, Any], name: str = "") -> "ModelFacts":
        fields = {**config.get("text_config", {}), **config}  # multimodal configs nest the language model's

        def number(name: str) -> int:
            v = fields.get(name)
            return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0

        context = next((number(n) for n in CONTEXT_LENGTH_FIELDS if number(n)), None)
        heads = number("num_attention_heads")
        return cls(path=str(path), name=name or str(path), layers=number("num_hidden_layers"), hidden=number("hidden_size"), heads=heads,
                   kv_heads=number("num_key_value_heads") or heads, vocab=number("vocab_size"),
                   max_positions=context, config=dict(config))

    @classmethod
    def read(cls, model_path: str, name: str = "") -> "ModelFacts":
        """The facts of the model in ``model_path`` (``name``: as the config names it); empty facts when it has no
        ``config.json`` (nothing is checked then); ConfigError naming the file when it is unreadable."""
        path = Path(model_path) / "config.json"
        if not path.is_file():
            return cls(path=str(model_path), name=name or str(model_path))
        try:
            return cls.from_config_json(model_path, json.loads(path.read_text()), name)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"the memory plan needs the model's config.json: {path}: {exc}") from None

    def require_config(self) -> Mapping[str, Any]:
        """The ``config.json`` dict; ConfigError naming the file when the model has none (the memory plan needs it)."""
        if not self.config:
            raise ConfigError(f"the memory plan needs the model's config.json: {Path(self.path) / 'config.json'}: "
                              "not found")
        return self.config
