#!/usr/bin/env bash
# Install kernelrl into the current Python.
#
#   bash scripts/setup.sh            the judge, its tests and the CPU learner: pip install -e '.[dev]'
#   bash scripts/setup.sh --judge    the judge alone: pip install -e . (numpy, ninja, rich, openai,
#                                    matplotlib, einops); nothing for training or serving
#   bash scripts/setup.sh --train    also the GPU training extra (vLLM, DeepSpeed, flash-attn)
#
# torch is installed (CPU build 2.13.0) only when no torch is importable, so a CUDA build already on
# the machine is kept. No option installs the GPU training extra unless --train is given, with or
# without a GPU: the judge needs none of it. bubblewrap (worker containment) comes from apt where
# root and a registry are there, else from the .deb in benchmarks/ (dpkg), else a notice.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
MODE=dev
TRAIN=0
for arg in "$@"; do
    case "$arg" in
        --judge) MODE=judge ;;
        --train) TRAIN=1 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "setup: unknown option $arg (--judge, --train)" >&2; exit 2 ;;
    esac
done
if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    "$PYTHON" -m pip install -q "torch==2.13.0"
fi
if [ "$MODE" = judge ]; then
    "$PYTHON" -m pip install -q -e .
else
    "$PYTHON" -m pip install -q -e ".[dev]"
fi
# Bytecode for the package: an editable install writes none, and where PYTHONDONTWRITEBYTECODE is set
# (and in every worker, which may not write) each interpreter would compile the kernelrl modules it
# imports on every start: 18 in a worker, more in a command (a worker's start, ~2 s here, took
# 0.1-0.2 s less with it when workers imported 52: medians of 8 starts). A file older than its
# source is ignored, not used.
"$PYTHON" -m compileall -q kernelrl >/dev/null || echo "setup: could not write kernelrl's bytecode" >&2
# Worker containment (kernelrl/judge/isolation/containment.py) needs bubblewrap: Debian's package, when missing.
if ! command -v bwrap >/dev/null 2>&1; then
    deb=$(ls benchmarks/bubblewrap_*.deb 2>/dev/null | head -n 1 || true)
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
            && (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) 2>/dev/null; then
        :
    elif [ "$(id -u)" = 0 ] && [ -n "$deb" ] && command -v dpkg >/dev/null 2>&1 && dpkg -i "$deb" >/dev/null; then
        echo "setup: bubblewrap installed from $deb (no registry)" >&2
    else
        echo "setup: bubblewrap (bwrap) is missing; install it (apt-get install bubblewrap, or as root" \
             "dpkg -i $deb) for full containment" >&2
    fi
fi
# The GPU training extra, only when asked. vLLM releases each require one exact torch version and
# flash-attn builds from source against the installed torch: pip must not replace the installed
# torch build with the one it would resolve, so the installed version is a constraint (pip stops
# with a conflict instead of swapping torch), and flash-attn gets no build isolation.
if [ "$TRAIN" = 1 ]; then
    constraint=$(mktemp)
    "$PYTHON" -c "import torch; print('torch==' + torch.__version__)" > "$constraint"
    echo "setup: installing the gpu extra (vllm, deepspeed, flash-attn) with $(cat "$constraint") pinned" >&2
    "$PYTHON" -m pip install -q -c "$constraint" --no-build-isolation -e ".[train,gpu]"
    rm -f "$constraint"
fi
