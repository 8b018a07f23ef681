#!/usr/bin/env bash
# Set up agentrl in ./.venv: `scripts/setup.sh` for the package, `scripts/setup.sh --dev` for tests too.
# Idempotent: a second run only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
EXTRAS=""
[[ "${1:-}" == "--dev" ]] && EXTRAS="[dev]"
if [[ ! -x .venv/bin/python ]]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch first and pinned: a bare `torch` requirement could resolve to a multi-GB CUDA build.
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
    .venv/bin/python -m pip install -q "torch==${AGENTRL_TORCH_VERSION:-2.13.0}"
fi
.venv/bin/python -m pip install -q -e ".${EXTRAS}"
echo "agentrl is set up in .venv ($(.venv/bin/agentrl version))"
