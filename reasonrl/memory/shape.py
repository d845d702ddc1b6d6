"""The model's shape from its ``config.json``: parameter counts and the saved activations of one decoder layer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Sequence, Tuple

REQUIRED_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
"""``config.json`` fields without which there is no plan (the others have defaults)."""
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear projections of a Llama-family decoder layer: LoRA's default targets (``actor.lora.target_modules``
empty adapts every one)."""


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a Llama-family ``config.json`` (Llama, Qwen2, Mistral, SmolLM) that the plan needs."""

    hidden_size: int
    """h (``hidden_size``)."""
    intermediate_size: int
    """i, the MLP's width (``intermediate_size``)."""
    num_layers: int
    """L (``num_hidden_layers``)."""
    num_heads: int
    """Attention heads (``num_attention_heads``)."""
    num_kv_heads: int
    """Key/value heads (``num_key_value_heads``; grouped-query attention when fewer than the heads)."""
    head_dim: int
    """Width of one head (``head_dim``, else h / heads)."""
    vocab_size: int
    """V (``vocab_size``)."""
    tied_embeddings: bool
    """The LM head is the input embedding (``tie_word_embeddings``): its parameters are counted once."""
    qkv_bias: bool
    """q, k and v projections carry biases (Qwen2, or ``attention_bias``)."""
    mlp_bias: bool = False
    """gate, up and down projections carry biases (``mlp_bias``)."""

    @classmethod
    def from_config_json(cls, config: Mapping[str, Any]) -> "ModelShape":
        """Read the shape; ValueError naming every missing or non-integer field. ``num_key_value_heads`` defaults to
        the attention heads, ``head_dim`` to hidden / heads, ``tie_word_embeddings`` to False; q/k/v carry biases for
        ``model_type`` qwen2 or when ``attention_bias`` is true."""
        if not isinstance(config, Mapping):
            raise ValueError(f"the model config must be a dict (config.json), got {type(config).__name__}")
        missing = [k for k in REQUIRED_FIELDS if k not in config]
        if missing:
            raise ValueError(f"the model's config.json lacks {', '.join(missing)}: the memory plan needs "
                             f"{', '.join(REQUIRED_FIELDS)}")
        values = {k: config[k] for k in REQUIRED_FIELDS}
        values["num_key_value_heads"] = config.get("num_key_value_heads") or config["num_attention_heads"]
        bad = [k for k, v in values.items() if isinstance(v, bool) or not isinstance(v, int) or v <= 0]
        if bad:
            raise ValueError("config.json fields must be positive integers: "
                             + ", ".join(f"{k}={values[k]!r}" for k in bad))
        heads = values["num_attention_heads"]
        head_dim = config.get("head_dim") or values["hidden_size"] // heads
        return cls(hidden_size=values["hidden_size"], intermediate_size=values["intermediate_size"],
                   num_layers=values["num_hidden_layers"], num_heads=heads,
                   num_kv_heads=values["num_key_value_heads"], head_dim=int(head_dim),
                   vocab_size=values["vocab_size"], tied_embeddings=bool(config.get("tie_word_embeddings", False)),
                   qkv_bias=config.get("model_type") == "qwen2" or bool(config.get("attention_bias", False)),
                   mlp_bias=bool(config.get("mlp_bias", False)))

    @property
    def kv_width(self) -> int:
        """kv: the width of the keys (and of the values), kv heads x head dim."""
        return self.num_kv_heads * self.head_dim

    def layer_parameters(self) -> int:
        """One decoder layer: q and o (h x heads*head_dim), k and v (h x kv), gate/up/down (3 h i), two RMSNorms
        (2h), plus biases where the config has them."""
        h, q, kv, i = self.hidden_size, self.num_heads * self.head_dim, self.kv_width, self.intermediate_size
        attention = 2 * h * q + 2 * h * kv + ((q + 2 * kv) if self.qkv_bias else 0)
        mlp = 3 * h * i + ((2 * i + h) if self.mlp_bias else 0)
        return attention + mlp + 2 * h

    def root_parameters(self) -> int:
        """What is not in a decoder layer (FSDP2's root unit): the embedding (V h), the final norm (h) and an untied
        LM head (V h)."""
        embed = self.vocab_size * self.hidden_size
        return embed + self.hidden_size + (0 if self.tied_embeddings else embed)

    def parameter_count(self) -> int:
        """P = L x layer parameters + root parameters (tied embeddings counted once)."""
        return self.num_layers * self.layer_parameters() + self.root_parameters()

    def critic_parameter_count(self) -> int:
        """The value model: the backbone (P without an untied LM head) plus the value head (h + 1)."""
        head = 0 if self.tied_embeddings else self.vocab_size * self.hidden_size
        return self.parameter_count() - head + self.hidden_size + 1

    def activation_bytes_per_token_layer(self, dt: int) -> float:
        """Saved activations of one eager decoder layer per token (HF Llama/Qwen2, sdpa/flash attention): the two
        RMSNorms keep their float32 input (2 x 4h); six h-wide tensors in dt (each norm's normalised input and
        output, the attention's query and output), 5 kv (keys, values), four i-wide ones of the MLP (gate, SiLU(gate),
        up, their product: 8i at bf16) and the attention's float32 log-sum-exp per head. Counted on the real
        transformers layer with saved-tensor hooks in tests/unit/memory/test_memory_plan.py."""
        h, kv, i = self.hidden_size, self.kv_width, self.intermediate_size
        return 8 * h + (12 * h + 5 * kv + 8 * i) * dt / 2 + 4 * self.num_heads

    def projection_dims(self) -> Dict[str, Tuple[int, int]]:
        """(in, out) features of each of a layer's linear projections (``PROJECTIONS``)."""
        h, q, kv, i = self.hidden_size, self.num_heads * self.head_dim, self.kv_width, self.intermediate_size
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, i),
                "up_proj": (h, i), "down_proj": (i, h)}

    def lora_targets(self, target_modules: Sequence[str]) -> Tuple[str, ...]:
        """The projections LoRA adapts (empty: all of them, as ``models.lora.resolve_target_modules`` does);
        ValueError naming a module the plan does not know."""
        unknown = [n for n in target_modules if n not in PROJECTIONS]
        if unknown:
            raise ValueError(f"actor.lora.target_modules: the memory plan knows {', '.join(PROJECTIONS)}, not "
                             f"{', '.join(unknown)}")
        return tuple(target_modules) or PROJECTIONS

    def lora_layer_parameters(self, rank: int, target_modules: Sequence[str]) -> int:
        """One layer's LoRA adapters: r (in + out) per adapted projection (A is r x in, B is out x r)."""
        dims = self.projection_dims()
        return sum(rank * sum(dims[n]) for n in self.lora_targets(target_modules))

    def lora_parameters(self, rank: int, target_modules: Sequence[str]) -> int:
        """Pa, every adapter of the model: L x ``lora_layer_parameters``."""
        return self.num_layers * self.lora_layer_parameters(rank, target_modules)

    def lora_activation_delta_per_token_layer(self, rank: int, target_modules: Sequence[str], dt: int) -> float:
        """How LoRA changes a layer's saved activations per token (``activation_bytes_per_token_layer``): B's input,
        A x (r in dt), is saved per adapted projection; the two RMSNorms' normalised inputs (2 h dt), saved only for
        the norms' own weight gradients, are not (LoRA freezes the norms). A's input is the projection's input, which
        the layer saves anyway (peft's dropout 0 is the identity). Counted with peft in tests/unit/memory/test_memory_plan.py."""
        return len(self.lora_targets(target_modules)) * rank * dt - 2 * self.hidden_size * dt
