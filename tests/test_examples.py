"""Shipped example candidates: well-formed, listed with a verdict, and judged as declared."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest
import torch

from kernelrl.candidate import Candidate, Language, defines_model_new
from kernelrl.examples import EXAMPLES_ROOT, Example, list_examples
from kernelrl.tasks import suites
from kernelrl.tasks.sizes import instantiate

EXAMPLES = list_examples()
CPU = [e for e in EXAMPLES if e.device == "cpu"]
GPU = [e for e in EXAMPLES if e.device == "cuda"]


def _ids(e: Example) -> str:
    return e.name


def _signature(source: str, cls: str) -> dict[str, list[str]]:
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {f.name: [a.arg for a in f.args.args] for f in node.body
                    if isinstance(f, ast.FunctionDef) and f.name in ("__init__", "forward")}
    raise AssertionError(f"no class {cls}")


def test_manifest_lists_every_file_once():
    on_disk = {p.relative_to(EXAMPLES_ROOT).as_posix() for p in EXAMPLES_ROOT.rglob("*.py") if p.name != "__init__.py"}
    listed = [e.path.relative_to(EXAMPLES_ROOT).as_posix() for e in EXAMPLES]
    assert len(listed) == len(set(listed))
    assert set(listed) == on_disk


def test_coverage_of_the_example_set():
    assert len({e.task for e in EXAMPLES}) >= 6
    langs = {(Candidate(source=e.source).language, e.expected) for e in EXAMPLES}
    assert (Language.CPP, "correct") in langs
    assert (Language.PYTORCH, "correct") in langs
    assert (Language.TRITON, "correct") in langs
    assert sum(Candidate(source=e.source).language is Language.CUDA for e in EXAMPLES) >= 2
    assert any(e.expected == "incorrect" for e in EXAMPLES)
    assert any(e.expected == "compile_error" for e in EXAMPLES)


@pytest.mark.parametrize("example", EXAMPLES, ids=_ids)
def test_example_is_well_formed(example):
    source = example.source
    ast.parse(source)
    assert defines_model_new(source)
    assert ast.get_docstring(ast.parse(source)), "each example says what it is in its docstring"
    task = suites.builtin_task(example.task)
    assert task.name == example.task
    assert example.path.parent.name == task.name.split("/", 1)[1], "folder is named after the task stem"
    assert _signature(source, "ModelNew") == _signature(task.source, "Model")
    language = Candidate(source=source).language
    assert language.needs_gpu == (example.device == "cuda")


def test_bad_manifest_values_are_rejected():
    with pytest.raises(ValueError, match="expected status"):
        Example(task="level1/softmax", path=EXAMPLES_ROOT, expected="fast", device="cpu")
    with pytest.raises(ValueError, match="device"):
        Example(task="level1/softmax", path=EXAMPLES_ROOT, expected="correct", device="tpu")
    assert all(e.device == "cuda" for e in list_examples(device="cuda"))


def _outputs(example: Example, seeds=(11, 12)) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Reference and candidate outputs at the small size, both built under the same seed."""
    tm = instantiate(suites.builtin_task(example.task), "small")
    module = types.ModuleType(f"example_{example.path.stem}")
    exec(compile(example.source, str(example.path), "exec"), module.__dict__)  # noqa: S102 - shipped example
    init = tm.get_init_inputs()
    torch.manual_seed(0)
    ref = tm.Model(*init).eval()
    torch.manual_seed(0)
    new = module.ModelNew(*init).eval()
    pairs = []
    for seed in seeds:
        torch.manual_seed(seed)
        inputs = tm.get_inputs()
        kept = [x.clone() for x in inputs]
        with torch.no_grad():
            pairs.append((ref(*inputs), new(*inputs)))
        assert all(torch.equal(a, b) for a, b in zip(inputs, kept)), "the candidate mutated its inputs"
    return pairs


def _matches(pairs) -> bool:
    return all(b.shape == a.shape and b.dtype == a.dtype and torch.allclose(b, a, atol=1e-4, rtol=1e-4)
               for a, b in pairs)


PLAIN_CPU = [e for e in CPU if Candidate(source=e.source).language is Language.PYTORCH
             and "torch.compile" not in e.source]
BUILT_CPU = [e for e in CPU if e not in PLAIN_CPU and e.expected != "compile_error"]


@pytest.mark.parametrize("example", PLAIN_CPU, ids=_ids)
def test_pytorch_examples_match_their_verdict_in_process(example):
    assert _matches(_outputs(example)) == (example.expected == "correct")


@pytest.mark.slow
@pytest.mark.parametrize("example", BUILT_CPU, ids=_ids)
def test_built_examples_match_their_verdict_in_process(example):
    assert _matches(_outputs(example)) == (example.expected == "correct")


@pytest.mark.slow
def test_build_error_example_fails_to_build():
    for example in CPU:
        if example.expected == "compile_error":
            with pytest.raises(Exception, match="(?i)error"):
                _outputs(example)


def _evaluate(example: Example, device: str, cache_dir: Path):
    from kernelrl.judge.evaluator import EvalConfig, evaluate

    task = suites.builtin_task(example.task)
    return evaluate(task, Candidate(source=example.source, origin=str(example.path)),
                    EvalConfig(device=device, cache_dir=cache_dir))


@pytest.mark.slow
@pytest.mark.parametrize("example", CPU, ids=_ids)
def test_evaluator_gives_the_declared_verdict_on_cpu(example, cache_dir):
    result = _evaluate(example, "cpu", cache_dir)
    assert result.status.value == example.expected, f"{example.name}: {result.status} {result.message}"
    if example.expected == "correct":
        assert result.speedup is not None and result.speedup > 0
    else:
        assert result.speedup is None
    if example.expected == "compile_error":
        assert "error" in (result.message + " ".join(map(str, result.errors))).lower()


@pytest.mark.gpu
@pytest.mark.parametrize("example", GPU, ids=_ids)
def test_evaluator_gives_the_declared_verdict_on_cuda(example, cache_dir):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    result = _evaluate(example, "cuda", cache_dir)
    assert result.status.value == example.expected, f"{example.name}: {result.status} {result.message}"
