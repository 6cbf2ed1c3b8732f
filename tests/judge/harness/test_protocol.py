"""The judge <-> worker protocol: typed headers both ways, and messages that do not fit refused."""

from __future__ import annotations

import pytest

from kernelrl.judge.harness import protocol as P
from kernelrl.judge.harness.channel import ChannelProtocolError


def test_every_kind_has_a_header_and_every_command_an_answer():
    assert set(P.HEADERS) == set(P.Kind)
    for command, answer in P.ANSWERS.items():
        assert command in P.HEADERS and answer in P.HEADERS


def test_headers_round_trip():
    header = P.Prepare(index=2, scales=[1.0, 0.9], shifts=[3, 7])
    kind, back = P.decode("prepare", P.encode(P.Kind.PREPARE, header))
    assert kind is P.Kind.PREPARE and back == header
    err = P.Error(phase=P.Phase.COMPILE, message="no ModelNew")
    kind, back = P.decode("error", {"phase": "compile", "message": "no ModelNew"})
    assert back == err and back.phase is P.Phase.COMPILE


@pytest.mark.parametrize("kind,fields,match", [
    ("nonsense", {}, "unknown message kind"),
    ("called", {"t_ns": [1]}, "missing field"),
    ("called", {"t_ns": [1], "plain": True, "commits": [0], "extra": 1}, "unexpected field"),
    ("called", {"t_ns": "fast", "plain": True, "commits": [0]}, "expected a list"),
    ("called", {"t_ns": [1.5], "plain": True, "commits": [0]}, "expected int"),
    ("called", {"t_ns": [1], "plain": True}, "missing field"),  # no commitments to its outputs
    ("error", {"phase": "later", "message": "m"}, "not a Phase"),
    ("warm", {"calls": 1, "call_ms": "1", "state_after": {}}, "expected a number"),
])
def test_messages_that_do_not_fit_are_refused(kind, fields, match):
    with pytest.raises(ChannelProtocolError, match=match):
        P.decode(kind, fields)


def test_a_header_of_the_wrong_kind_cannot_be_sent():
    with pytest.raises(TypeError):
        P.encode(P.Kind.CALL, P.Prepare(index=0, scales=[1.0], shifts=[0]))
