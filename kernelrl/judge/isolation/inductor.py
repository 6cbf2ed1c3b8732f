"""torch.compile's C++ toolchain in a worker: what it would redo in every fresh worker, done once.

Every worker is a fresh interpreter with a private scratch (`kernelrl.judge.isolation.sandbox`), so
torch.compile's caches (inductor's, under TMPDIR and the worker's cache folder) start cold but for
what the judge gives it (`kernelrl.judge.isolation.compilecache`: its task's compiled graphs and its own),
and never reach another worker: that is what keeps one program's build out of another's.
A cold CPU compile in a worker also repeats two things that depend on no program (measured on
a 2-core machine: ~14 s of CPU for a one-kernel graph, ~3.5 s without them):
- a precompiled header of torch's own headers (~6 s), built for reuse by later compiles in the
  same cache, which a worker never has: `worker_env` turns it off
  (`TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS=0`). The macro it adds only adds includes
  (`torch/csrc/inductor/cpp_wrapper/common.h`): the generated and compiled code is the same;
- the vector ISA check (~6 s): each ISA the CPU reports (AVX512, AVX2) is compiled into a test
  library and loaded in a child process, to learn whether this compiler can build it. The
  answer is the machine's and the toolchain's, not the program's: the judge learns it once
  (`start_vec_isa_check`, in a child interpreter with a worker's environment and its own empty
  caches, holding the device's shared lock; the evaluator starts it at its first judging that
  may compile, so a process that never compiles never pays it) and keeps it in its cache folder, keyed by torch,
  Python, the C++ compiler's version and the CPU's flags. Only when every ISA the CPU reports
  passed, so that skipping the check picks the same ISA list and vectorises the same way, do
  workers get `TORCHINDUCTOR_VEC_ISA_OK=1` (inductor's own switch for "trust the CPU flags").
  Workers started before the answer is known run the check themselves, as before.

Guarantees: a worker compiles the same code as with torch's defaults: no setting here changes
what inductor generates, only work it repeats; a failed or partial check sets nothing.

Does not share compiled artifacts between workers itself: under full containment the judge keeps
what a worker compiled and gives it to the workers allowed to read it (`kernelrl.judge.isolation.compilecache`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

# Always set in a worker's environment (`kernelrl.judge.isolation.sandbox.worker_env`).
BASE_ENV = {
    # torch.compile compiles in this process, not in a pool of workers that would outlive the
    # call that started them (and look like work left running).
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
    # A precompiled header pays off only when a cache outlives the worker (see the docstring).
    "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0",
}
VEC_ISA_OK_ENV = "TORCHINDUCTOR_VEC_ISA_OK"
RECORD = "inductor-vec-isa.json"  # in the evaluator's cache folder
_PROBE_LIMIT_S = 300.0
# Run in a child interpreter with a worker's environment: the ISAs inductor finds by its own
# check, and those it takes when told to trust the CPU's flags, with whether each vectorises.
_PROBE = """
import json
from torch._inductor import config, cpu_vec_isa as v
if config.cpp.vec_isa_ok is not None:
    raise SystemExit("vec_isa_ok is already set")
checked = [[str(i), bool(i)] for i in v.valid_vec_isa_list()]
v.valid_vec_isa_list.cache_clear()
config.cpp.vec_isa_ok = True
forced = [[str(i), bool(i)] for i in v.valid_vec_isa_list()]
print(json.dumps({"checked": checked, "forced": forced}))
"""

_verified: set[str] = set()  # keys whose check passed, in this process
_guard = threading.Lock()


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return platform.processor()


def _compiler_version(env: dict[str, str]) -> str:
    cxx = shutil.which(env.get("CXX") or "g++", path=env.get("PATH"))
    if cxx is None:
        return ""
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"{os.path.realpath(cxx)}\n{out.stdout}"


def toolchain_key(env: dict[str, str]) -> str | None:
    """What the ISA check's answer depends on; None when there is no C++ compiler to ask."""
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None
    compiler = _compiler_version(env)
    if not compiler:
        return None
    parts = [torch_version, sys.executable, sys.version, platform.machine(), _cpu_flags(), compiler]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def passes(found: dict[str, list[list[object]]]) -> bool:
    """Skipping the check is the same as checking: the same ISAs, and every one of them vectorises."""
    checked, forced = found.get("checked"), found.get("forced")
    return bool(checked) and checked == forced and all(ok is True for _, ok in checked or [])


def _read(cache_dir: Path, key: str) -> bool:
    try:
        record = json.loads((Path(cache_dir) / RECORD).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("key") == key and record.get("ok") is True


def _probe(env: dict[str, str]) -> dict[str, list[list[object]]] | None:
    with tempfile.TemporaryDirectory(prefix="kernelrl-vec-isa-") as tmp:
        env = {**env, "HOME": tmp, "TMPDIR": tmp, "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor")}
        env.pop(VEC_ISA_OK_ENV, None)
        try:
            out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, cwd=tmp,
                                 timeout=_PROBE_LIMIT_S)
        except (OSError, subprocess.SubprocessError):
            return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    try:
        found = json.loads(out.stdout.strip().splitlines()[-1])
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def check_vec_isa(cache_dir: Path, env: dict[str, str]) -> bool:
    """Whether workers may skip inductor's ISA check on this machine: read from the cache folder,
    or learned now (a child interpreter, seconds) and written there."""
    key = toolchain_key(env)
    if key is None:
        return False
    if key in _verified or _read(cache_dir, key):
        with _guard:
            _verified.add(key)
        return True
    found = _probe(env)
    if found is None:
        return False
    ok = passes(found)
    record = Path(cache_dir) / RECORD
    with contextlib.suppress(OSError):
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps({"key": key, "ok": ok, **found}))
        os.replace(tmp, record)
    if ok:
        with _guard:
            _verified.add(key)
    return ok


def start_vec_isa_check(cache_dir: Path, env: dict[str, str],
                        hold: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext,
                        ) -> threading.Thread:
    """`check_vec_isa` in the background, inside `hold` (the device's shared lock: it compiles)."""
    def run() -> None:
        key = toolchain_key(env)
        if key is None or key in _verified or _read(cache_dir, key):
            check_vec_isa(cache_dir, env)  # remembers it, probes nothing
            return
        with hold():
            check_vec_isa(cache_dir, env)

    thread = threading.Thread(target=run, name="kernelrl-vec-isa", daemon=True)
    thread.start()
    return thread


def inductor_env() -> dict[str, str]:
    """What a worker's environment gets: `BASE_ENV`, and `VEC_ISA_OK_ENV` once this process verified it."""
    with _guard:
        verified = bool(_verified)
    return {**BASE_ENV, **({VEC_ISA_OK_ENV: "1"} if verified else {})}
