"""The judge's channel: framing, deadlines, closed pipes, the shared arena, and refusal of anything
but plain data and tensors."""

from __future__ import annotations

import fcntl
import json
import os
import struct
import time

import pytest
import torch

from kernelrl.judge.harness.channel import Arena, Channel, ChannelClosed, ChannelProtocolError, ChannelTimeout


def _pair(capacity: int = 1 << 26) -> tuple[Channel, Channel]:
    a_r, b_w = os.pipe()
    b_r, a_w = os.pipe()
    arena = Arena.create(capacity)
    return Channel(a_r, a_w, arena), Channel(b_r, b_w, Arena(arena.fd, arena.capacity))


def _raw(a: Channel, header: dict) -> None:
    """A frame written by hand, as a hostile worker would."""
    head = json.dumps(header).encode()
    os.write(a.write_fd, struct.pack(">I", len(head)) + head)


def test_round_trip_header_and_every_kind_of_value():
    a, b = _pair()
    payload = {"outputs": [torch.arange(4.0), (torch.ones(2, 2, dtype=torch.bfloat16), 3)], "none": None,
               "dtype": torch.float16, "empty": torch.empty(0, 3), "scalar": torch.tensor(2.5),
               "mask": torch.tensor([True, False]), "strided": torch.arange(6.0).reshape(2, 3).t(),
               "args": (3, (1, 1), "same", 0.5, True)}
    a.send("ran", {"n": 2}, payload)
    msg = b.recv(time.monotonic() + 5)
    assert msg.kind == "ran" and msg.header == {"n": 2}
    got = msg.payload
    assert torch.equal(got["outputs"][0], torch.arange(4.0)) and got["outputs"][1][1] == 3
    assert got["outputs"][1][0].dtype is torch.bfloat16 and got["dtype"] is torch.float16 and got["none"] is None
    assert got["empty"].shape == (0, 3) and got["scalar"].shape == () and got["mask"].dtype is torch.bool
    assert torch.equal(got["strided"], torch.arange(6.0).reshape(2, 3).t())
    assert got["args"] == (3, (1, 1), "same", 0.5, True) and isinstance(got["args"][1], tuple)


def test_what_is_read_is_a_copy_the_sender_cannot_change_later():
    a, b = _pair()
    a.send("output_data", {}, {"output": torch.ones(1000)})
    got = b.recv(time.monotonic() + 5).payload["output"]
    a.send("output_data", {}, {"output": torch.zeros(1000)})  # the same bytes of the arena, rewritten
    assert torch.equal(got, torch.ones(1000))


def test_a_payload_given_away_lets_go_of_each_tensor_before_the_next_is_copied(monkeypatch):
    import weakref

    a, b = _pair()
    first, second, kept = torch.ones(1000), torch.full((500,), 2.0), torch.arange(3.0)
    gone = weakref.ref(first)
    payload = {"inputs": [first], "outputs": ([second], kept)}
    del first, second
    seen: list[bool] = []  # at each copy into the arena: is the first tensor still alive?
    frombuffer = torch.frombuffer
    monkeypatch.setattr(torch, "frombuffer", lambda *args, **kw: seen.append(gone() is not None) or frombuffer(*args, **kw))
    a.send("inputs", {}, payload, give=True)
    monkeypatch.undo()
    assert seen == [True, False, False]  # alive while copied, let go before the next
    assert payload == {} and kept.tolist() == [0.0, 1.0, 2.0]  # emptied; what others hold is untouched
    got = b.recv(time.monotonic() + 5).payload
    assert torch.equal(got["inputs"][0], torch.ones(1000)) and torch.equal(got["outputs"][0][0], torch.full((500,), 2.0))
    assert torch.equal(got["outputs"][1], kept)
    mine = {"output": torch.ones(4)}
    a.send("output_data", {}, mine)  # not given: the sender's payload is left as it was
    assert torch.equal(mine["output"], torch.ones(4))


def test_recv_times_out():
    _a, b = _pair()
    with pytest.raises(ChannelTimeout):
        b.recv(time.monotonic() + 0.2)


def test_closed_pipe_is_reported():
    a, b = _pair()
    os.close(a.write_fd)
    with pytest.raises(ChannelClosed):
        b.recv(time.monotonic() + 5)


def test_closing_twice_closes_no_descriptor_that_took_a_closed_ones_number():
    # A worker is killed, then closed (the pool's starter, `close` after `kill`); meanwhile another
    # thread may open a new worker's pidfd or pipes under the numbers just freed.
    a, _b = _pair()
    numbers = {a.read_fd, a.write_fd, a.arena.fd}
    a.close()
    a.arena.close()
    opened: list[int] = []
    while not numbers <= set(opened) and len(opened) < 256:  # the lowest free numbers come first
        opened.append(os.open(os.devnull, os.O_RDONLY))
    assert numbers <= set(opened)
    try:
        a.close()
        a.arena.close()
        for fd in opened:
            os.fstat(fd)  # EBADF had a second close taken it
        assert a.pending(0.0)  # a closed channel reads as ended, at once
        with pytest.raises(ChannelClosed):
            a.recv(time.monotonic() + 1)
    finally:
        for fd in opened:
            os.close(fd)


class Lazy(torch.Tensor):
    pass


def test_a_tensor_subclass_cannot_be_sent():
    a, _b = _pair()
    with pytest.raises(ChannelProtocolError, match="Lazy"):
        a.send("output", {}, {"output": torch.ones(3).as_subclass(Lazy)})


def test_objects_cannot_be_sent():
    a, _b = _pair()
    with pytest.raises(ChannelProtocolError):
        a.send("output", {}, {"output": object()})
    with pytest.raises(ChannelProtocolError, match="string keys"):
        a.send("output", {}, {1: torch.ones(1)})


@pytest.mark.parametrize("payload", [
    {"bytes": 64, "tree": ["T", "float32", [16], 10 ** 9]},  # outside the arena
    {"bytes": 64, "tree": ["T", "float32", [1000], 0]},  # longer than the payload it claims
    {"bytes": 64, "tree": ["T", "object", [1], 0]},  # not a tensor dtype
    {"bytes": 64, "tree": ["T", "float32", [-4], 0]},  # a negative dimension
    {"bytes": 1 << 40, "tree": ["v", 1]},  # more than the arena holds
    {"bytes": 0, "tree": ["x", "os.system"]},  # an unknown node
    {"bytes": 0, "tree": ["d", [[1, ["v", 1]]]]},  # a dict key that is not a string
    {"bytes": 0, "tree": ["v", {"nested": "object"}]},  # a value that is not a scalar
    "not a description",
])
def test_a_forged_payload_description_is_refused(payload):
    a, b = _pair()
    _raw(a, {"kind": "ran", "payload": payload})
    with pytest.raises(ChannelProtocolError):
        b.recv(time.monotonic() + 5)


def test_a_deeply_nested_header_is_a_protocol_error_not_a_crash():
    a, b = _pair()
    head = b'{"kind": "ran", "x": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"  # within one pipe buffer
    os.write(a.write_fd, struct.pack(">I", len(head)) + head)
    with pytest.raises(ChannelProtocolError):
        b.recv(time.monotonic() + 5)


def test_oversized_header_is_refused():
    a, b = _pair()
    os.write(a.write_fd, struct.pack(">I", 1 << 30))
    with pytest.raises(ChannelProtocolError):
        b.recv(time.monotonic() + 5)


def test_a_payload_larger_than_the_arena_is_refused_before_anything_is_written():
    a, _b = _pair(capacity=1 << 16)
    with pytest.raises(ChannelProtocolError, match="exceeds"):
        a.send("output", {}, {"output": torch.ones(1 << 16)})


def test_the_arena_cannot_be_resized_by_the_other_side():
    a, b = _pair()
    for size in (0, 1 << 30):
        with pytest.raises(PermissionError):
            os.ftruncate(b.arena.fd, size)
    assert fcntl.fcntl(a.arena.fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SEAL


def test_two_tensors_claiming_one_range_are_refused():
    """A forged description naming one byte range twice would have the judge copy it twice."""
    a, b = _pair()
    node = ["T", "float32", [16], 0]
    _raw(a, {"kind": "ran", "payload": {"bytes": 64, "tree": ["l", [node, node]]}})
    with pytest.raises(ChannelProtocolError, match="where the one before ended"):
        b.recv(time.monotonic() + 5)


def test_an_unsized_arena_accepts_no_payload_on_the_judges_side():
    a_r, b_w = os.pipe()
    b_r, a_w = os.pipe()
    judge = Channel(a_r, a_w, Arena.create(None))
    head = json.dumps({"kind": "hello", "payload": {"bytes": 0, "tree": ["v", 1]}}).encode()
    os.write(b_w, struct.pack(">I", len(head)) + head)
    with pytest.raises(ChannelProtocolError, match="before the arena was sized"):
        judge.recv(time.monotonic() + 5)
    for fd in (b_r, b_w):
        os.close(fd)


def test_a_sized_arena_pins_no_more_memory_than_its_size():
    arena = Arena.create(None)
    arena.seal(1 << 20)
    with pytest.raises(OSError):
        os.posix_fallocate(arena.fd, 0, 1 << 30)  # what a worker tried: past the size, refused
    os.posix_fallocate(arena.fd, 0, arena.capacity)
    assert arena.allocated() <= arena.capacity == 1 << 20
    with pytest.raises(ValueError):
        arena.seal(1 << 30)


def test_arena_need_fits_each_message_and_no_more():
    from kernelrl.judge.harness.channel import arena_need, payload_bytes

    x = torch.ones(1000)
    assert payload_bytes({"a": [x, x], "b": 3}) == 2 * 4032
    need = arena_need([x], {"outputs": [x, x, x]}, None)
    a_r, b_w = os.pipe()
    b_r, a_w = os.pipe()
    arena = Arena.create(need)
    sender = Channel(b_r, b_w, Arena(arena.fd, 0))  # a worker's side: the size read from the memfd
    sender.send("ran", {}, {"outputs": [x, x, x]})
    assert Channel(a_r, a_w, arena).recv(time.monotonic() + 5).payload["outputs"][2].equal(x)
    with pytest.raises(ChannelProtocolError, match="exceeds"):
        sender.send("ran", {}, {"outputs": [x] * 5})


def test_a_commitment_pins_an_outputs_bytes_shape_and_dtype():
    from kernelrl.judge.harness.channel import commitment

    x = torch.randn(64, 33)
    assert commitment([x, (x[:3],)]) == commitment([x.clone(), (x[:3].clone(),)])  # values, not storage
    y = x.clone()
    y[5, 7] += 1e-3
    assert commitment(y) != commitment(x)
    assert commitment(x.reshape(33, 64)) != commitment(x)
    assert commitment(x.view(torch.int32)) != commitment(x)
    assert commitment(torch.ones(3, dtype=torch.float16)) != commitment(torch.zeros(3, dtype=torch.float16))


@pytest.mark.parametrize("start", [0, 1, 2, 3])
def test_a_commitment_is_the_same_for_an_output_and_its_copy_wherever_its_storage_starts(start):
    # the worker commits to the output it has (perhaps a view into a larger buffer); the judge
    # recomputes it from the copy it is handed, which starts at offset 0
    from kernelrl.judge.harness.channel import commitment

    base = torch.randn(4 + 64 * 6)
    for n in (64 * 6, 63, 62):  # byte counts divisible by 8, by 4 only, and (as bytes) by neither
        view = base[start:start + n]
        assert commitment(view) == commitment(view.clone())
        as_bytes = view.view(torch.uint8)[1:]
        assert commitment(as_bytes) == commitment(as_bytes.clone())


def test_a_samples_commitments_are_each_outputs_own():
    # the worker commits to a whole sample at once (one read-back per device): each entry must be
    # what the judge recomputes from that call's output alone
    from kernelrl.judge.harness.channel import commitment, commitments

    outs = [torch.randn(8, 3), (torch.arange(5), torch.ones(2, dtype=torch.float16)), None, torch.empty(0)]
    assert commitments(outs) == [commitment(o) for o in outs]
    assert commitments(outs)[2] == 0 and commitments([]) == []


def test_a_commitment_wraps_and_still_sees_one_changed_word():
    from kernelrl.judge.harness.channel import commitment

    big = torch.full((1024,), 2**62, dtype=torch.int64)  # its sum overflows 64 bits many times
    changed = big.clone()
    changed[100] += 1
    assert commitment(big) == commitment(big.clone()) and commitment(changed) != commitment(big)
