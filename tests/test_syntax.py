"""`kernelrl.syntax.parse` from many threads at once: CPython 3.11's tree conversion keeps its
recursion depth in interpreter-wide state, so unguarded `ast.parse` in threads can raise SystemError
for source that parses (this stress, with `ast.parse` in place of `syntax.parse`, raised it 16 times
in 360 parses on Python 3.11.7)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from kernelrl import syntax

SOURCE = (Path(__file__).resolve().parents[1] / "kernelrl" / "judge" / "group.py").read_text()


class _Churn:
    def __del__(self) -> None:  # a finalizer the collector runs, switching threads mid-parse
        pass


def test_parsing_from_many_threads_at_once_never_fails():
    errors: list[str] = []

    def work() -> None:
        for _ in range(30):
            junk = [_Churn() for _ in range(200)]
            for j in junk:
                j.me = j  # type: ignore[attr-defined]  # cycles: the collector runs during the next parse
            del junk
            try:
                syntax.parse(SOURCE)
            except SystemError as e:
                errors.append(str(e))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []
