"""The benchmarks' model shapes: the random-weight Qwen2-shaped models (and their tokenizers) and the parameter count
MFU divides by.

``benchmarks/gpu_grpo_step.py``, ``gpu_trl_anchor.py``, ``gpu_anchors.py``, ``gpu_update_mfu.py`` and ``gpu_packing.py``
build the same model from the same seed, so their figures compare.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Optional

import torch

H200_BF16_DENSE_FLOPS = 989e12
GIB = float(1 << 30)

SHAPES: Dict[str, Dict[str, Any]] = {
    # Qwen/Qwen2.5-1.5B-Instruct's config.json (architecture numbers only).
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                         rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
    # Qwen/Qwen2.5-7B-Instruct's config.json (architecture numbers only): 28 heads and 4 KV heads, so T = 2 or 4.
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
    # The same architecture, small enough for a CPU smoke test (head_dim 64: vLLM's CPU attention needs it).
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=4096, max_position_embeddings=4096, rope_theta=10000.0,
                 rms_norm_eps=1e-6, tie_word_embeddings=True),
}
SHAPE_ALIASES = {"1.5b": "qwen2.5-1.5b", "7b": "qwen2.5-7b"}


def build_tokenizer(vocab_size: int):
    """A fast word-level tokenizer over the words ``t0 .. t{V-1}`` (every id the model can sample decodes); eos =
    pad = the last id. Saved with the model (``write_random_model``) and handed to TRL as an object
    (``gpu_trl_anchor.py``); the trainer's directory holds ``build_model_dir_tokenizer`` instead."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins the words with spaces
    eos = f"t{vocab_size - 1}"
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token=eos, pad_token=eos)


EOS_TEXT = "<|endoftext|>"


def build_model_dir_tokenizer(vocab_size: int):
    """The tokenizer of ``trainer_model_dir``: transformers 5's ``AutoTokenizer`` loads any ``model_type: qwen2``
    directory as ``Qwen2Tokenizer`` (byte-level BPE, its own pre-tokenizer), which reads ``build_tokenizer``'s
    word-level file as no tokens at all. So this one is a byte-level BPE with no merges: ids 0..255 are the 256
    byte-level characters (every character of an ASCII text is one token: ``"abc"`` -> 3 ids), the ids up to
    ``vocab_size - 2`` are filler tokens ``<f{i}>`` (a random model samples them; they decode), and the last id is
    ``<|endoftext|>`` (eos = pad)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    if vocab_size < len(alphabet) + 1:
        raise ValueError(f"a vocabulary of {vocab_size} ids cannot hold the {len(alphabet)} byte-level characters")
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab.update({f"<f{i}>": i for i in range(len(alphabet), vocab_size - 1)})
    vocab[EOS_TEXT] = vocab_size - 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TEXT, pad_token=EOS_TEXT, unk_token=EOS_TEXT)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "chat_template.jinja")


def trainer_model_dir(shape: str, base: Path, seed: int = 0) -> Path:
    """The model of ``write_random_model(shape, base / shape)`` as a directory the trainer loads with
    ``AutoTokenizer``: ``base / (shape + "-trainer")`` holds links to the model's weight and config files and its own
    ``build_model_dir_tokenizer`` (the word-level directory stays as it is for ``gpu_trl_anchor.py``, which hands
    TRL the word-level tokenizer object). Kept if already there."""
    source = write_random_model(shape, Path(base) / shape, seed)
    target = Path(base) / f"{shape}-trainer"
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        link = target / path.name
        if path.name not in TOKENIZER_FILES and not link.exists():
            link.symlink_to(path.resolve())
    if not (target / "tokenizer.json").exists():
        build_model_dir_tokenizer(int(SHAPES[shape]["vocab_size"])).save_pretrained(target)
    return target


def write_random_model(shape: str, directory: Path, seed: int = 0, in_child: Optional[bool] = None) -> Path:
    """Save a random-init bf16 Qwen2 model of ``shape`` with ``build_tokenizer``'s word-level tokenizer (no Hub) as a
    HF directory; kept if already there. The trainer reads ``trainer_model_dir`` instead.

    On a GPU the random init runs there (1.5B is slow on a CPU), in a child process (``in_child``; default: when
    CUDA is available): a CUDA context lives until its process ends, and the benchmark's driver keeping one held
    0.61 GiB of the GPU beside the workers for the whole run (the twenty-second session's out-of-memory run)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; known: {', '.join(sorted(SHAPES))}")
    directory = Path(directory)
    if (directory / "config.json").exists() and (directory / "tokenizer.json").exists():
        return directory
    if in_child is None:
        in_child = torch.cuda.is_available()
    if not in_child:
        _write_random_model(shape, str(directory), seed)
        return directory
    code = "import sys; from reasonrl.bench.shapes import _write_random_model as w; w(sys.argv[1], sys.argv[2], " \
           "int(sys.argv[3]))"
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    subprocess.run([sys.executable, "-c", code, shape, str(directory), str(seed)], check=True, env=env)
    return directory


def _write_random_model(shape: str, directory: str, seed: int) -> None:
    from transformers import AutoModelForCausalLM, Qwen2Config

    Path(directory).mkdir(parents=True, exist_ok=True)
    vocab = int(SHAPES[shape]["vocab_size"])
    config = Qwen2Config(**SHAPES[shape], hidden_act="silu", initializer_range=0.02, use_sliding_window=False,
                         bos_token_id=None, eos_token_id=vocab - 1, pad_token_id=vocab - 1)
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory, safe_serialization=True)
    build_tokenizer(vocab).save_pretrained(directory)


def tiny_policy(directory, tokenizer_path: str) -> str:
    """A 2-layer random Llama (seed 0) with a real tokenizer and its chat template, saved as a HF directory: the whole
    loop runs on it in seconds (plumbing, not learning; the tests' ``tiny_policy`` and the fleet's fault matrix)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(str(directory))
    tok.save_pretrained(str(directory))
    return str(directory)


def parameter_count(shape: str) -> int:
    """Parameters of ``shape`` (tied embeddings counted once: they are also the LM head's matmul)."""
    s = SHAPES[shape]
    h, inter, layers = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"]
    kv_dim = s["num_key_value_heads"] * (h // s["num_attention_heads"])
    attention = (h * h + h) + 2 * (h * kv_dim + kv_dim) + h * h  # q (bias), k (bias), v (bias), o
    per_layer = attention + 3 * h * inter + 2 * h  # + gate/up/down, two RMSNorms
    embed = s["vocab_size"] * h
    return layers * per_layer + embed + h + (0 if s["tie_word_embeddings"] else embed)
