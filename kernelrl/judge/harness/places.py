"""Where a fully contained worker builds and keeps its compiler caches: the folders of its scratch,
and the environment variables that name them to the worker.

Shared by the launcher (`kernelrl.judge.isolation.containment`, `kernelrl.judge.isolation.sandbox`, which make the
scratch and set the variables) and the worker (`kernelrl.judge.harness.worker`, which reads them). Imports
nothing, so a worker reads it before importing torch.
"""

from __future__ import annotations

# Inside a fully contained worker: its scratch, and where it builds and keeps compiler caches.
SCRATCH = "/tmp"
BUILD_SUBDIR = "build/ext"  # under SCRATCH: TORCH_EXTENSIONS_DIR; Triton's cache is its triton/
CACHE_SUBDIR = "cache"  # under SCRATCH: the worker's cache root (inductor's cache is its inductor/)
BUILD_DIR_ENV = "KERNELRL_BUILD_DIR"  # read by the worker instead of the build folder the judge names
CACHE_ROOT_ENV = "KERNELRL_CACHE_ROOT"  # read by the worker instead of the judge's cache folder
# What a fully contained worker is told of its scratch's folders (`kernelrl.judge.harness.worker` reads them).
SCRATCH_FOLDERS_ENV = {BUILD_DIR_ENV: f"{SCRATCH}/{BUILD_SUBDIR}", CACHE_ROOT_ENV: f"{SCRATCH}/{CACHE_SUBDIR}"}
