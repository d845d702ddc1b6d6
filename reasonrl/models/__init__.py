"""Model loading, value head, log-probs."""
from .loader import (cache_root, convert_packaged_gguf, load_causal_lm, load_tokenizer,
                     resolve_model_path, torch_dtype)

__all__ = ["cache_root", "convert_packaged_gguf", "load_causal_lm", "load_tokenizer", "resolve_model_path",
           "torch_dtype"]
