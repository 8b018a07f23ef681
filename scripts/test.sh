#!/usr/bin/env bash
# Set up everything the tests need (system packages, a Docker engine, the venv) and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# One torch thread per process: the suite runs many small models and server threads on few cores,
# where extra intra-op threads only contend (measured: decode steps 10-20 ms at 1 thread, 150-300 ms at 2).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
scripts/system-deps.sh
# vLLM's own environment (.venv-vllm): the real-vLLM tests (marker `vllm`) need it, and fail rather than skip here.
scripts/setup.sh --dev --vllm
export AGENTRL_REQUIRE_VLLM="${AGENTRL_REQUIRE_VLLM:-1}"
# The viewer's browser tests (marker `browser`) need Debian's chromium + chromium-driver (system-deps.sh):
# here a missing browser fails them instead of skipping.
export AGENTRL_REQUIRE_BROWSER="${AGENTRL_REQUIRE_BROWSER:-1}"
# Gates before the tests (seconds; any finding fails the run): lint, formatting, types, and the
# architecture's import contracts ([tool.importlinter] in pyproject.toml).
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports
exec .venv/bin/python -m pytest "$@"
