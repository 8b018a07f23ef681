#!/usr/bin/env bash
# Set up everything the tests need (system packages, a Docker engine, the venv) and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/system-deps.sh
scripts/setup.sh --dev
exec .venv/bin/python -m pytest "$@"
