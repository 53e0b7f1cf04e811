#!/usr/bin/env bash
# The GPU check (not in CI): install the vllm extra, then run one model folder (1–8B parameters) on --backend vllm and
# on --backend transformers --device cuda, and print one table (parity to the bfloat16 bar, seconds per call, peak GPU
# memory) plus the CI's CPU bars on cuda. Usage: scripts/gpu_check.sh MODEL_DIR [extra gpu_check.py flags]
# Needs a CUDA machine with a recent driver; vLLM 0.20.2 (the version TransformerLens 4.3 validated) is installed into
# the checkout's .venv (./run setup makes it), with torch's CUDA build it pulls in.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:?usage: scripts/gpu_check.sh MODEL_DIR [flags]}"
shift
./run setup
.venv/bin/pip install --quiet -e ".[vllm]"
.venv/bin/python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device: this check needs a GPU'"
HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" exec .venv/bin/python scripts/gpu_check.py --model "$model" "$@"
