"""The server judges code clients send: it refuses to start where workers cannot be fully
contained, unless its operator says otherwise."""

from __future__ import annotations

import pytest
from serve_helpers import FakeBackend

from kernelrl.judge.evaluator import EvalConfig
from kernelrl.judge.isolation.sandbox import SandboxConfig
from kernelrl.result import Containment
from kernelrl.serve.server import StartError


def _less_than_full() -> EvalConfig:
    # asking for less than full stands in for a machine without bubblewrap
    return EvalConfig(sandbox=SandboxConfig(containment=Containment.NAMESPACES))


def test_less_than_full_containment_refuses_to_start(start_server):
    with pytest.raises(StartError, match="allow-uncontained"):
        start_server(FakeBackend(), eval=_less_than_full())


def test_the_operator_may_accept_the_risk(start_server):
    server = start_server(FakeBackend(), eval=_less_than_full(), allow_uncontained=True)
    assert server.containment is not Containment.FULL


def test_full_containment_starts_and_says_so(start_server):
    from kernelrl.judge.isolation.containment import probe

    if probe(Containment.FULL, SandboxConfig().uids).level is not Containment.FULL:
        pytest.skip("bubblewrap cannot contain workers on this machine")
    assert start_server(FakeBackend()).containment is Containment.FULL
