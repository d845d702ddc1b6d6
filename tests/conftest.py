"""Test-wide settings: offline Hub, the shared data folder, in-process vLLM, and the real model fixture."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_shared = ROOT.parent / "shared" / "data"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
if _shared.is_dir():
    os.environ.setdefault("REASONRL_DATA_DIR", str(_shared))

import socket  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = Path(os.environ.get("REASONRL_DATA_DIR", _shared))
    if not path.is_dir():
        pytest.fail(f"data folder {path} missing: set REASONRL_DATA_DIR to the folder holding gsm8k_train.jsonl")
    return path


@pytest.fixture(scope="session")
def model_path() -> str:
    """The real SmolLM2-135M-Instruct, converted once from the packaged GGUF to a cached safetensors directory."""
    from reasonrl.models import resolve_model_path

    return resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")


@pytest.fixture(scope="module")
def listener():
    """A TCP server on the host; no sandboxed program may ever connect to it."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()
