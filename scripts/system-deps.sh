#!/usr/bin/env bash
# System packages and services the test suite needs. Safe to run twice.
set -euo pipefail
cd "$(dirname "$0")/.."
exit 0
