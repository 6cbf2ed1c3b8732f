"""Work a program's build needs that depends on no program, done once by the judge ahead of the
builds that need it: inductor's vector ISA check (`kernelrl.judge.isolation.inductor`) and the
precompiled torch headers for C++ builds (`kernelrl.judge.isolation.headers`).

Guarantees: each starts in the background, under the hold it is given (the device's shared lock:
it compiles while no measurement runs), only when a batch may need it: the ISA check at the first
batch that may run torch.compile, a header when a C++ candidate names its flags. A process that
never compiles pays for neither. Neither changes what a build makes, only the work it repeats.

Does not wait for either: a worker that builds before they are done checks or compiles for itself.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from kernelrl.judge.isolation.headers import HeaderStore
from kernelrl.judge.isolation.inductor import start_vec_isa_check

# What in a program's text may start torch.compile (the ISA check is for inductor's C++ builds).
COMPILES = re.compile(r"\bcompile\b|_dynamo|_inductor")
Hold = Callable[[], contextlib.AbstractContextManager[None]]


class Ahead:
    """The judge's work ahead of builds, for one evaluator (see the module docstring)."""

    def __init__(self, *, cache_dir: Path, headers_root: Path, worker_env: Callable[[], dict[str, str]], hold: Hold) -> None:
        self._cache_dir, self._env, self._hold = cache_dir, worker_env, hold
        self._guard = threading.Lock()
        self._isa_check_started = False
        try:
            self.headers: HeaderStore | None = HeaderStore(headers_root, hold=hold)
        except (OSError, RuntimeError):  # a read-only cache folder, no compiler: builds compile the header
            self.headers = None

    @property
    def shown(self) -> tuple[str, ...]:
        """Folders every worker is shown read-only: the headers' (none without a store)."""
        return () if self.headers is None else (str(self.headers.folder),)

    def before(self, sources: Sequence[str], *, compiles: bool = False) -> None:
        """Start what a batch of these programs may need (`compiles`: torch.compile runs whatever
        the programs say, as for a compiled baseline)."""
        if compiles or any(COMPILES.search(s) for s in sources):
            with self._guard:
                start, self._isa_check_started = not self._isa_check_started, True
            if start:
                start_vec_isa_check(self._cache_dir, self._env(), self._hold)  # the environment a worker gets now
        if self.headers is not None:
            self.headers.prepare(sources)
