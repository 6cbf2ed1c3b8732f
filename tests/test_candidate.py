"""Candidate extraction from LLM answers and language detection."""

from __future__ import annotations

from kernelrl.candidate import Language, detect_language, extract_code

A = "class ModelNew:\n    pass\n"


def test_last_complete_block_defining_model_new_wins():
    answer = f"Analysis...\n```python\nx = 1\n```\nThen:\n```python\n{A}```\nAnd a usage example:\n```python\nprint(1)\n```\n"
    assert extract_code(answer) == A


def test_truncated_last_block_is_ignored():
    answer = f"```python\n{A}```\nimproved:\n```python\nclass ModelNew:\n    def forward(self"
    assert extract_code(answer) == A


def test_no_block_gives_none():
    assert extract_code("I cannot help with that.") is None
    assert extract_code("```python\nclass ModelNew: pass") is None


def test_tildes_and_longer_fences():
    assert extract_code(f"~~~py\n{A}~~~\n") == A
    assert extract_code(f"````python\n{A}```\nstill inside\n````\n").startswith("class ModelNew")


def test_language_detection():
    assert detect_language("import torch\nclass ModelNew: ...") is Language.PYTORCH
    assert detect_language("from torch.utils.cpp_extension import load_inline\nload_inline(cpp_sources=s)") is Language.CPP
    assert detect_language("load_inline(cpp_sources=a, cuda_sources=b)") is Language.CUDA
    assert detect_language("import triton\n@triton.jit\ndef k(): pass") is Language.TRITON
    assert detect_language("import triton as t\n@t.autotune(configs=[], key=[])\n@t.jit\ndef k(): pass") is Language.TRITON
    assert detect_language("from triton import jit\n@jit\ndef k(): pass") is Language.TRITON
    # importing Triton is not writing a kernel: a PyTorch program that probes for it stays timed on a CPU
    assert detect_language("try:\n    import triton\nexcept ImportError:\n    triton = None\n") is Language.PYTORCH


def test_only_triton_on_cpu_is_interpreted():
    assert Language.TRITON.interpreted_on("cpu")
    assert not Language.TRITON.interpreted_on("cuda")
    assert not any(lang.interpreted_on("cpu") for lang in Language if lang is not Language.TRITON)
