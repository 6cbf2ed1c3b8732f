#!/usr/bin/env bash
# Install kernelrl into the current Python. torch is installed (CPU build 2.13.0) only when no
# torch is importable, so a CUDA build already on the machine is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    "$PYTHON" -m pip install -q "torch==2.13.0"
fi
"$PYTHON" -m pip install -q -e ".[dev]"
