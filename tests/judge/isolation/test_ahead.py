"""The judge's work ahead of builds: started only for a batch that may need it, and once."""

from __future__ import annotations

import contextlib
from pathlib import Path

from kernelrl.judge.isolation import ahead as A

CPP = 'from torch.utils.cpp_extension import load_inline\n_e = load_inline(name="a", cpp_sources=[S], extra_cflags=["-O3"])\n'


def _ahead(tmp_path: Path, monkeypatch) -> tuple[A.Ahead, list[str], list[list[str]]]:
    started: list[str] = []
    prepared: list[list[str]] = []
    monkeypatch.setattr(A, "start_vec_isa_check", lambda cache_dir, env, hold: started.append(env["WHO"]))
    made = A.Ahead(cache_dir=tmp_path, headers_root=tmp_path / "headers", worker_env=lambda: {"WHO": "worker"},
                   hold=contextlib.nullcontext)
    assert made.headers is not None
    monkeypatch.setattr(made.headers, "prepare", lambda sources: prepared.append(list(sources)))
    return made, started, prepared


def test_the_isa_check_starts_once_at_the_first_batch_that_may_compile(tmp_path: Path, monkeypatch):
    made, started, _ = _ahead(tmp_path, monkeypatch)
    made.before(["import torch\n", CPP])
    assert started == []  # nothing here compiles with inductor
    made.before(["m = torch.compile(m)\n"])
    made.before(["m = torch.compile(m)\n"], compiles=True)
    assert started == ["worker"]


def test_a_compiled_baseline_starts_the_isa_check_without_a_program(tmp_path: Path, monkeypatch):
    made, started, _ = _ahead(tmp_path, monkeypatch)
    made.before([], compiles=True)
    assert started == ["worker"]


def test_every_batchs_sources_are_offered_to_the_headers_and_their_folder_shown(tmp_path: Path, monkeypatch):
    made, _, prepared = _ahead(tmp_path, monkeypatch)
    made.before([CPP, "import torch\n"])
    assert prepared == [[CPP, "import torch\n"]]
    assert made.headers is not None and made.shown == (str(made.headers.folder),)


def test_without_a_store_nothing_is_shown(tmp_path: Path, monkeypatch):
    blocked = tmp_path / "headers"
    blocked.write_text("a file where the folder would be")
    made = A.Ahead(cache_dir=tmp_path, headers_root=blocked, worker_env=dict, hold=contextlib.nullcontext)
    assert made.headers is None and made.shown == ()
    made.before([CPP])  # no store: nothing to make, no error
