"""The judge's channel: framing, deadlines, closed pipes, and refusal of anything but tensors."""

from __future__ import annotations

import io
import os
import pickle
import struct
import time

import pytest
import torch

from kernelrl.judge.channel import (
    Channel,
    ChannelClosed,
    ChannelProtocolError,
    ChannelTimeout,
)


def _pair() -> tuple[Channel, Channel]:
    a_r, b_w = os.pipe()
    b_r, a_w = os.pipe()
    return Channel(a_r, a_w), Channel(b_r, b_w)


def test_round_trip_header_and_tensors():
    a, b = _pair()
    a.send("ran", {"n": 2}, {"outputs": [torch.arange(4.0), (torch.ones(2, 2), 3)]})
    msg = b.recv(time.monotonic() + 5)
    assert msg.kind == "ran" and msg.header == {"n": 2}
    assert torch.equal(msg.payload["outputs"][0], torch.arange(4.0))


def test_recv_times_out():
    _a, b = _pair()
    with pytest.raises(ChannelTimeout):
        b.recv(time.monotonic() + 0.2)


def test_closed_pipe_is_reported():
    a, b = _pair()
    os.close(a.write_fd)
    with pytest.raises(ChannelClosed):
        b.recv(time.monotonic() + 5)


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_pickled_objects_are_refused():
    # A worker that sends a crafted pickle must not execute code in the judge.
    a, b = _pair()
    head = b'{"kind": "ran"}'
    body = io.BytesIO()
    torch.save({"x": _Evil()}, body, pickle_module=pickle)
    os.write(a.write_fd, struct.pack(">IQ", len(head), len(body.getvalue())) + head + body.getvalue())
    with pytest.raises(ChannelProtocolError):
        b.recv(time.monotonic() + 5)


class Lazy(torch.Tensor):
    pass


def test_tensor_subclass_is_refused():
    a, b = _pair()
    a.send("output", {}, {"output": torch.ones(3).as_subclass(Lazy)})
    with pytest.raises(ChannelProtocolError):
        b.recv(time.monotonic() + 5)


def test_oversized_frame_is_refused():
    a, b = _pair()
    b.max_payload_bytes = 16
    a.send("output", {}, {"output": torch.ones(100)})
    with pytest.raises(ChannelProtocolError):
        b.recv(time.monotonic() + 5)
