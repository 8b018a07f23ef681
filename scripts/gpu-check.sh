#!/usr/bin/env bash
# agentrl's CUDA path on one GPU, no download, one table; exits non-zero on any failure (scripts/gpu_check.py).
#   scripts/gpu-check.sh            on a CUDA machine (scripts/setup.sh first; --vllm for the vLLM row)
#   scripts/gpu-check.sh --dry-run  what a CPU can run of it (CI runs this)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[[ -x "$PY" ]] || PY="${PYTHON:-python3}"
exec timeout "${AGENTRL_GPU_CHECK_TIMEOUT:-900}" "$PY" scripts/gpu_check.py "$@"
