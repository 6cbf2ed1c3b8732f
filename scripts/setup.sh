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
# Worker containment (kernelrl/judge/containment.py) needs bubblewrap: Debian's package, when missing.
if ! command -v bwrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) \
            || echo "setup: could not install bubblewrap; workers will be less than fully contained" >&2
    else
        echo "setup: bubblewrap (bwrap) is missing; install it (apt-get install bubblewrap) for full containment" >&2
    fi
fi
# The gpu extra (vLLM, DeepSpeed, flash-attn) only where CUDA is present. pip must not replace the
# installed torch build with the one it would resolve: the installed version is a constraint (pip
# stops with a conflict instead). flash-attn builds against that torch: no build isolation.
if "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    constraint=$(mktemp)
    "$PYTHON" -c "import torch; print('torch==' + torch.__version__)" > "$constraint"
    "$PYTHON" -m pip install -q -c "$constraint" --no-build-isolation -e ".[gpu]"
    rm -f "$constraint"
fi
