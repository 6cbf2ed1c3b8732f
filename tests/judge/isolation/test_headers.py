"""Precompiled torch headers: which flags a candidate's build gets a header for, what the judge's
compiler is given, how a header enters the store, and the store's checks on itself.

The fast tests run a stand-in compiler (a script that writes the file it is told to and says
whether it used a header); the slow one makes a real header for torch and checks that a build
with torch's flags uses it."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kernelrl.judge.harness.toolchain import SharedHeaders
from kernelrl.judge.isolation import headers as H


def _source(call: str) -> str:
    return f"from torch.utils.cpp_extension import load_inline\n_ext = {call}\n"


@pytest.mark.parametrize("call, flags", [
    ('load_inline(name="a", cpp_sources=[S], functions=["f"])', ()),
    ('load_inline(name="a", cpp_sources=[S], extra_cflags=["-O3", "-fopenmp"])', ("-O3", "-fopenmp")),
    ('torch.utils.cpp_extension.load_inline("a", S, extra_cflags=("-O2",))', ("-O2",)),
])
def test_a_literal_allowed_flag_set_is_wanted_in_its_order(call, flags):
    assert H.wanted(_source(call)) == {flags}


@pytest.mark.parametrize("call", [
    'load_inline(name="a", cpp_sources=[S], extra_cflags=["-O3", "-fplugin=/tmp/p.so"])',
    'load_inline(name="a", cpp_sources=[S], extra_cflags=["@/etc/shadow"])',
    'load_inline(name="a", cpp_sources=[S], extra_cflags=["-O3", "-o", "/root/x"])',
    'load_inline(name="a", cpp_sources=[S], extra_cflags=["-B/tmp/bin"])',
    'load_inline(name="a", cpp_sources=[S], extra_cflags=FLAGS)',  # not a literal: not read
    'load_inline(name="a", cpp_sources=[S], cuda_sources=[C], extra_cflags=["-O3"])',  # a CUDA build
    'load_inline("a", S, C)',
])
def test_no_header_is_wanted_for_flags_outside_the_list_or_a_cuda_build(call):
    assert H.wanted(_source(call)) == set()


def test_unparsable_source_wants_nothing():
    assert H.wanted("def (:") == set()


FAKE_CXX = r'''#!{python}
import os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_CXX_LOG"], "a") as log:
    log.write(" ".join(args) + "\n")
if "-o" in args:
    open(args[args.index("-o") + 1], "w").write("made")
if "-H" in args and os.environ.get("FAKE_CXX_USES", "1") == "1":
    gch = os.path.join(os.environ["CPATH"], "torch", "extension.h.gch")
    for name in os.listdir(gch):
        sys.stderr.write("! " + os.path.join(gch, name) + "\n")
'''


@pytest.fixture
def fake_cxx(tmp_path: Path, monkeypatch):
    cxx = tmp_path / "fake-c++"
    cxx.write_text(FAKE_CXX.replace("{python}", sys.executable))
    cxx.chmod(0o755)
    log = tmp_path / "cxx.log"
    monkeypatch.setenv("FAKE_CXX_LOG", str(log))
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "get_cxx_compiler", lambda: str(cxx))
    H.toolchain_key.cache_clear()
    yield log
    H.toolchain_key.cache_clear()


def test_a_made_header_enters_the_folder_gcc_reads_whole_and_read_only(tmp_path: Path, fake_cxx: Path):
    store = H.HeaderStore(tmp_path / "headers")
    assert store.make(("-O3",)) and store.has(("-O3",))
    made = store.folder / "torch" / "extension.h.gch" / H.variant_name(("-O3",))
    assert made.read_text() == "made" and stat.S_IMODE(made.stat().st_mode) == 0o644
    assert store.variants() == [made.name]  # nothing half-made or of the probe's left beside it
    command = fake_cxx.read_text().splitlines()[0].split()
    # made from the copy of torch's header beside it: the file a second include of it finds
    assert command[:2] == ["-x", "c++-header"] and command[2] == str(store.folder / "torch" / "extension.h")
    assert (store.folder / "torch" / "extension.h").read_bytes() == H._torch_header().read_bytes()
    assert command[-1] == "-O3" and "-DTORCH_API_INCLUDE_EXTENSION_H" in command
    assert H.usable(store.folder)


def test_the_judges_compiler_is_never_given_a_flag_outside_the_list(tmp_path: Path, fake_cxx: Path):
    store = H.HeaderStore(tmp_path / "headers")
    with pytest.raises(ValueError, match="-fplugin"):
        store.make(("-O3", "-fplugin=/tmp/p.so"))
    assert not fake_cxx.exists()


def test_a_header_a_build_would_not_use_is_not_kept_nor_made_again(tmp_path: Path, fake_cxx: Path, monkeypatch):
    monkeypatch.setenv("FAKE_CXX_USES", "0")
    store = H.HeaderStore(tmp_path / "headers")
    assert not store.make(("-O2",)) and store.variants() == []
    calls = len(fake_cxx.read_text().splitlines())
    assert not store.make(("-O2",))
    assert len(fake_cxx.read_text().splitlines()) == calls


def test_no_more_than_the_cap_of_variants_is_made(tmp_path: Path, fake_cxx: Path, monkeypatch):
    monkeypatch.setattr(H, "MAX_VARIANTS", 2)
    store = H.HeaderStore(tmp_path / "headers")
    assert store.make(("-O1",)) and store.make(("-O2",))
    assert not store.make(("-O3",)) and len(store.variants()) == 2


def test_prepare_makes_what_new_sources_want_in_the_background_under_the_hold(tmp_path: Path, fake_cxx: Path):
    held: list[str] = []

    @contextlib.contextmanager
    def hold():
        held.append("in")
        yield
        held.append("out")

    store = H.HeaderStore(tmp_path / "headers", hold=hold)
    sources = [_source('load_inline(name="a", cpp_sources=[S], extra_cflags=["-O3"])'),
               _source('load_inline(name="b", cpp_sources=[S], extra_cflags=["-O3"])'),
               "import torch\n"]
    store.prepare(sources)
    store.wait(60)
    assert store.has(("-O3",)) and held == ["in", "out"]
    store.prepare(sources)  # seen before: nothing more to make
    store.wait(60)
    assert held == ["in", "out"]


def test_a_folder_another_user_could_write_is_not_usable(tmp_path: Path, fake_cxx: Path):
    store = H.HeaderStore(tmp_path / "headers")
    assert store.make(())
    assert H.usable(store.folder)
    gch = store.folder / "torch" / "extension.h.gch"
    gch.chmod(0o777)
    assert not H.usable(store.folder)
    gch.chmod(0o755)
    copy = store.folder / "torch" / "extension.h"
    copy.chmod(0o666)  # the header a build compiles where no variant fits
    assert not H.usable(store.folder)
    copy.chmod(0o644)
    assert H.usable(store.folder)
    (gch / "planted.gch").symlink_to("/etc/passwd")
    assert not H.usable(store.folder)


def test_a_worker_puts_the_store_first_and_keeps_torchs_own_header_out(tmp_path: Path, monkeypatch):
    from torch.utils import cpp_extension

    seen: dict[str, object] = {}

    def original(*args, **kwargs):
        seen.update(kwargs)

    def read_only() -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(cpp_extension, "load_inline", original)
    monkeypatch.setattr(cpp_extension, "remove_extension_h_precompiler_headers", read_only)
    monkeypatch.setenv("CPATH", "/somewhere")
    SharedHeaders(str(tmp_path)).install()
    assert os.environ["CPATH"] == f"{tmp_path}{os.pathsep}/somewhere"
    cpp_extension.load_inline("a", "", use_pch=True)
    assert seen["use_pch"] is False  # torch would make one in its own folder
    cpp_extension.remove_extension_h_precompiler_headers()  # raised before: never touches the install


@pytest.mark.slow
def test_a_real_header_is_used_by_a_build_with_torchs_flags(tmp_path: Path):
    """A header made for `-O3` is used by a compile as torch's loader runs it (its extension's name
    defined too), and one made for no flags is not used by an `-O3` compile."""
    store = H.HeaderStore(tmp_path / "headers")
    assert store.make(("-O3",))
    source = tmp_path / "main.cpp"
    # twice, as a candidate's source is after the line torch's loader adds
    source.write_text("#include <torch/extension.h>\n#include <torch/extension.h>\nint f() { return 1; }\n")

    def used(flags: list[str]) -> bool:
        from torch.utils import cpp_extension

        out = subprocess.run([cpp_extension.get_cxx_compiler(), "-H", "-fsyntax-only", "-DTORCH_EXTENSION_NAME=x",
                              *H._torch_flags(), *flags, str(source)], capture_output=True, text=True,
                             env={**os.environ, "CPATH": str(store.folder)}, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return any(line.startswith("! ") for line in out.stderr.splitlines())

    assert used(["-O3"])
    assert not used(["-O0"])


@pytest.mark.slow
def test_a_cpp_candidate_built_beside_a_header_made_for_its_flags_is_correct(tmp_path: Path):
    """The judge's header for a candidate's flags present (its build uses it), a contained build
    of the shipped C++ softmax builds and is judged correct."""
    from kernelrl.examples import list_examples
    from kernelrl.judge.evaluator import EvalConfig, Evaluator
    from kernelrl.result import Status
    from kernelrl.tasks.suites import builtin_task

    example = next(e for e in list_examples(device="cpu") if e.task == "level1/softmax" and e.name.endswith("cpp_fused"))
    (flags,) = H.wanted(example.source)
    assert H.HeaderStore(tmp_path / "headers").make(flags)
    config = EvalConfig(cache_dir=tmp_path / "cache", headers_dir=tmp_path / "headers", timeout_s=60)
    with Evaluator(config) as ev:
        result = ev.evaluate(builtin_task("level1/softmax"), example.source)
    assert result.status is Status.CORRECT, result.message
