"""Proposer specs and options."""

from __future__ import annotations

import pytest

from kernelrl.proposers import ProposerError, make_proposer


def test_make_proposer_rejects_bad_specs_and_options(tmp_path):
    with pytest.raises(ProposerError, match="unknown proposer"):
        make_proposer("gpt:foo")
    with pytest.raises(ProposerError, match="model name"):
        make_proposer("openai:", api_key="k", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ProposerError, match="does not take"):
        make_proposer("heuristic", temperature=0.1)
    with pytest.raises(ProposerError, match="concurrency"):
        make_proposer("openai:m", api_key="k", base_url="http://127.0.0.1:9/v1", concurrency=0)
    with pytest.raises(ProposerError, match="no such file"):
        make_proposer(f"replay:{tmp_path / 'missing.jsonl'}")
    with pytest.raises(ProposerError, match="strict"):
        make_proposer("heuristic", policy="strict")
    assert make_proposer("heuristic", policy="strict-pytorch").spec == "heuristic"  # PyTorch answers are answers
