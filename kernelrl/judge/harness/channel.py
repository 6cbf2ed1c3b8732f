"""The private message channel between the judge and a worker process.

A message is a JSON header, framed with its length, sent over a pipe the judge created and
passed to the worker by file descriptor (never stdin or stdout, which the candidate's prints
would pollute). Its payload (tensors, and the lists, tuples, dicts and scalars around them) does
not cross the pipe: the sender copies each tensor's bytes into a shared-memory arena (`Arena`, a
sealed memfd the judge created and the worker inherited) and the header carries a description
of the payload's shape; the receiver copies every tensor out of the arena into memory of its
own. Moving a 32 MiB output is then two memory copies, not a serialisation, a pipe transfer in
1 MiB pieces and a deserialisation.

Guarantees for the judging side:
- nothing received is ever unpickled or evaluated: a payload is a JSON tree of tagged nodes
  (plain scalars, lists, tuples, string-keyed dicts, dtypes, devices, tensors); a tensor node
  names an allowed dtype, a shape and a byte range of the arena, all checked (the range inside
  the arena, its length exactly shape x item size) before anything is copied; anything else is
  `ChannelProtocolError`, never an exception of another kind;
- the judge copies what it reads out of the arena before it looks at it, so a worker that keeps
  writing into the arena (a thread of the candidate's) changes nothing the judge compares;
- the arena is made empty and sized by the judge before the worker is given any command
  (`Arena.seal`): for a candidate, to what the task's messages need (`arena_need`), so that
  memory the worker pins in it (writing, `posix_fallocate`) is bounded by that size; once sized
  nobody, the judge included, can shrink or grow it (memfd seals), so a worker cannot make the
  judge's read of it fault;
- a message's claims are checked before anything is allocated or copied: its byte count within
  the arena's size, and its tensors laid out as a sender lays them (in order, each at the
  aligned end of the one before, none overlapping), so what the judge copies out of one message
  is at most the arena's size; the header is bounded by `MAX_HEADER_BYTES`;
- `recv` honours a deadline and reports a closed pipe as `ChannelClosed`.

Does not authenticate the worker: the candidate runs inside the worker and could write frames
and arena bytes of its own. The judge therefore drives the protocol (a reply is accepted only as
the answer to the request just sent) and never trusts a worker's claim it can check itself
(outputs are compared in the judge, timings are cross-checked against the judge's own clock).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import select
import struct
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_FRAME = struct.Struct(">I")  # header length
MAX_HEADER_BYTES = 8 << 20
DEFAULT_ARENA_BYTES = 16 << 30  # the most a payload may hold; memory is used only as it is written
_ALIGN = 64
# Larger payloads give their pages back once read, so an arena does not hold a big transfer's
# memory for the rest of its worker's life.
_RELEASE_BYTES = 256 << 20
# dtypes a tensor node may name (torch's names)
_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool",
           "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64")
_MAX_NODES = 1 << 20  # nodes in one payload tree


class ChannelClosed(EOFError):
    """The other side closed its end (it exited or crashed)."""


class ChannelTimeout(TimeoutError):
    """No complete message arrived before the deadline."""


class ChannelProtocolError(ValueError):
    """A frame or a payload was malformed, too large, or not made of the allowed types."""


@dataclass(frozen=True)
class Message:
    kind: str
    header: dict[str, Any]
    payload: Any = None


class Arena:
    """A shared-memory region for payloads: a memfd sealed at a fixed size, mapped per message.

    The judge creates it (`Arena.create`) and passes its descriptor to the worker, which opens it
    with `Arena(fd, capacity)`. The protocol is strictly request then answer, so one arena serves
    both directions: each side writes its payload from offset 0 and the other copies it out
    before answering.
    """

    def __init__(self, fd: int, capacity: int) -> None:
        self.fd = fd
        # 0: not known yet (a worker's side, before the judge sized it): read from the memfd on use
        self._capacity = capacity
        self._judge = False  # made by `create`: the judge's side, which reads nothing before sizing it
        # Mapped once and kept (grown to the largest payload so far): mapping afresh per message
        # faulted every page in again, which cost more than the copy itself (64 MiB: 45-89 ms
        # against 2-12 ms into a kept mapping, on this machine).
        self._mm: mmap.mmap | None = None

    def _map(self, length: int) -> mmap.mmap:
        if self._mm is None or len(self._mm) < length:
            size = min(self.capacity, max(_aligned_page(length), 2 * len(self._mm) if self._mm else 0))
            self._unmap()
            self._mm = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        return self._mm

    def _unmap(self) -> None:
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # a view still holds it (an error was raised while copying): unmapped with the view
            self._mm = None

    @property
    def capacity(self) -> int:
        return self._capacity if self._capacity > 0 else os.fstat(self.fd).st_size

    @property
    def sealed(self) -> bool:
        return self._capacity > 0

    @classmethod
    def create(cls, capacity: int | None = DEFAULT_ARENA_BYTES) -> Arena:
        """A new arena, sized and sealed at `capacity`; None: empty, to be sized once (`seal`)."""
        fd = os.memfd_create("kernelrl-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        arena = cls(fd, 0)
        arena._judge = True
        if capacity is not None:
            arena.seal(capacity)
        return arena

    def seal(self, capacity: int) -> None:
        """Size the arena at `capacity` bytes for good (the judge's side, before the worker's first command).

        Seals: no one can shrink it under a reader, grow it past what was decided, or unseal it.
        """
        if self.sealed:
            raise ValueError(f"the arena is already sized ({self._capacity} B)")
        capacity = _aligned_page(max(capacity, 1))
        os.ftruncate(self.fd, capacity)
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        self._capacity = capacity

    def allocated(self) -> int:
        """Bytes of memory the arena holds now (its pages, whoever wrote or allocated them)."""
        return os.fstat(self.fd).st_blocks * 512

    # -- writing ------------------------------------------------------------------------------

    def write(self, payload: Any, *, give: bool = False) -> dict[str, Any]:
        """Copy a payload into the arena; the description the header carries. `give`: the payload is
        the sender's to give away: its lists and dicts are emptied and each tensor let go once it is
        in the arena, so a tensor nothing else holds is freed before the next one is copied (a
        worker answering with a set and its output holds the arena's copy and one of them, not both)."""
        tensors: list[Any] = []
        tree = _describe(payload, tensors, [0])
        offsets, total = [], 0
        for t in tensors:
            offsets.append(total)
            total += _aligned(t.numel() * t.element_size())
        if total > self.capacity:
            raise ChannelProtocolError(f"payload of {total} B exceeds the arena's {self.capacity} B")
        if give:
            _empty(payload)
        if total:
            import torch

            mm = self._map(total)
            for i, off in enumerate(offsets):
                t, tensors[i] = tensors[i], None
                n = t.numel() * t.element_size()
                if n:
                    dst = torch.frombuffer(mm, dtype=torch.uint8, count=n, offset=off)
                    dst.copy_(t.detach().reshape(-1).view(torch.uint8))
                    del dst
                del t
        _place(tree, iter(offsets))
        return {"bytes": total, "tree": tree}

    # -- reading ------------------------------------------------------------------------------

    def read(self, description: Any) -> Any:
        """The payload a description names, copied out of the arena (ChannelProtocolError if malformed)."""
        if not isinstance(description, dict) or not isinstance(description.get("bytes"), int):
            raise ChannelProtocolError("payload description is not an object with a byte count")
        total = description["bytes"]
        if self._judge and not self.sealed:
            raise ChannelProtocolError("a payload came before the arena was sized")
        if not 0 <= total <= self.capacity:
            raise ChannelProtocolError(f"payload of {total} B outside the arena's {self.capacity} B")
        count = [0, 0]  # nodes seen, where the next tensor must start
        if total == 0:
            return _build(description.get("tree"), None, 0, count)
        mm = self._map(total)
        try:
            return _build(description.get("tree"), mm, total, count)
        finally:
            if total >= _RELEASE_BYTES and hasattr(mmap, "MADV_REMOVE"):
                mm.madvise(mmap.MADV_REMOVE, 0, _aligned_page(total))

    def close(self) -> None:
        """Unmap and close the memfd, once: a second call closes nothing (its number may be
        another descriptor's by then, opened by another thread of the judge)."""
        self._unmap()
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def commitment(x: Any) -> int:
    """A number that pins down the bytes of every tensor in `x` (a call's output), as a worker
    commits to it when the call returns and the judge recomputes it from the output it is handed.

    The wrapping sum of the tensors' 64-bit words (32-bit words, or bytes, where the byte count
    does not allow 64), mixed with their shapes and dtypes: one memory pass, the same on every
    device (a sum modulo 2**64 does not depend on the order it is added in). It binds a worker to
    outputs it has; it is not a cryptographic hash.
    """
    return commitments([x])[0]


def commitments(outputs: Sequence[Any]) -> list[int]:
    """`commitment` of each of `outputs` (a sample's calls), read back from each device at once.

    Computed inside the judge's clock, for every member alike, so its cost is part of the exchange
    taken off every sample, and a smaller exchange is less noise in every ratio: 64-bit words need
    no widening (0.024 ms per MiB on one CPU thread, against 0.085 for 32-bit words widened to
    64), and on a GPU the sums of a whole sample come back in one copy, not one per call.
    """
    import torch

    sums: list[Any] = []  # one int64 scalar per tensor, on the tensor's device
    layout: list[list[tuple[int, int]]] = []  # per output: (index into sums, dtype-and-shape code)
    for x in outputs:
        parts = []
        for t in _tensors(x):
            flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
            parts.append((len(sums), zlib.crc32(f"{t.dtype}{tuple(t.shape)}".encode())))
            sums.append(_word_sum(flat, torch))
        layout.append(parts)
    values = [0] * len(sums)
    by_device: dict[Any, list[int]] = {}
    for i, s in enumerate(sums):
        by_device.setdefault(s.device, []).append(i)
    for indices in by_device.values():
        for i, v in zip(indices, torch.stack([sums[i] for i in indices]).tolist()):
            values[i] = int(v) % (1 << 64)
    out = []
    for parts in layout:
        total = 0
        for i, kind in parts:
            total = (total * 1_000_003 + values[i] + kind) % (1 << 61)
        out.append(total)
    return out


def _word_sum(flat: Any, torch: Any) -> Any:
    """The sum of a byte tensor's words as an int64 scalar on its device (wrapping): 64-bit words
    where the byte count allows, else 32-bit, else bytes. The width depends on the byte count
    alone, so an output and its copy (the payload the judge is handed) agree wherever the output's
    storage starts; a view whose start is not aligned for its width is copied first (rare, and
    cheap next to the call)."""
    for width, dtype in ((8, torch.int64), (4, torch.int32)):
        if flat.numel() % width == 0:
            if flat.storage_offset() % width:
                flat = flat.clone()
            return flat.view(dtype).sum(dtype=torch.int64)
    return flat.sum(dtype=torch.int64)


def _tensors(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return [x] if hasattr(x, "element_size") and hasattr(x, "numel") else []


def payload_bytes(payload: Any) -> int:
    """The arena bytes a payload takes (tensors aligned as `Arena.write` lays them)."""
    tensors: list[Any] = []
    _describe(payload, tensors, [0])
    return sum(_aligned(t.numel() * t.element_size()) for t in tensors)


def arena_need(*payloads: Any) -> int:
    """The arena size that carries each of `payloads` (the largest of them), plus a page."""
    return max((payload_bytes(p) for p in payloads if p is not None), default=0) + mmap.PAGESIZE


class Channel:
    def __init__(self, read_fd: int, write_fd: int, arena: Arena) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd
        self.arena = arena

    def send(self, kind: str, header: dict[str, Any] | None = None, payload: Any = None, *, give: bool = False) -> None:
        """One message; `give`: the payload is given away as it is copied (`Arena.write`)."""
        fields: dict[str, Any] = {"kind": kind, **(header or {})}
        if payload is not None:
            fields["payload"] = self.arena.write(payload, give=give)
        try:
            head = json.dumps(fields).encode()
        except (TypeError, ValueError) as e:
            raise ChannelProtocolError(f"header cannot be sent: {e}") from e
        view = memoryview(_FRAME.pack(len(head)) + head)
        while view:
            n = os.write(self.write_fd, view)
            view = view[n:]

    def recv(self, deadline: float | None = None) -> Message:
        (head_len,) = _FRAME.unpack(self._read_exact(_FRAME.size, deadline))
        if head_len > MAX_HEADER_BYTES:
            raise ChannelProtocolError(f"header too large: {head_len} B")
        try:
            header = json.loads(self._read_exact(head_len, deadline))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise ChannelProtocolError(f"malformed header: {type(e).__name__}") from e
        if not isinstance(header, dict) or not isinstance(header.get("kind"), str):
            raise ChannelProtocolError("header is not an object with a 'kind'")
        kind = header.pop("kind")
        payload = None
        if "payload" in header:
            payload = self.arena.read(header.pop("payload"))
        return Message(kind=kind, header=header, payload=payload)

    def pending(self, timeout: float) -> bool:
        """Whether a message (or the worker's end of the pipe closing) is there to read, waiting at
        most `timeout` seconds; reads nothing. A closed channel has its end there at once."""
        if self.read_fd < 0:
            return True
        ready, _, _ = select.select([self.read_fd], [], [], max(0.0, timeout))
        return bool(ready)

    def _read_exact(self, n: int, deadline: float | None) -> bytes | bytearray:
        if self.read_fd < 0:
            raise ChannelClosed("this side closed the channel")
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            if deadline is not None:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    raise ChannelTimeout("deadline passed while waiting for the worker")
                ready, _, _ = select.select([self.read_fd], [], [], wait)
                if not ready:
                    raise ChannelTimeout("deadline passed while waiting for the worker")
            k = os.readv(self.read_fd, [view[got:got + (4 << 20)]])
            if not k:
                raise ChannelClosed("worker closed the channel")
            got += k
        return buf

    def close(self) -> None:
        """Close both pipe ends, once: a worker is often killed, then closed, and a descriptor
        closed twice may by then be a new worker's pidfd or pipe, opened by the pool's starter."""
        fds, self.read_fd, self.write_fd = (self.read_fd, self.write_fd), -1, -1
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


# ---------------------------------------------------------------------------------------------
# The payload tree: [tag, ...] nodes, so no value of the payload can pass for a tag.


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _aligned_page(n: int) -> int:
    page = mmap.PAGESIZE
    return max(page, (n + page - 1) // page * page)


def _empty(x: Any) -> None:
    """Every list and dict of a payload emptied (tuples cannot be: their lists and dicts are)."""
    if isinstance(x, (list, tuple)):
        for v in x:
            _empty(v)
        if isinstance(x, list):
            x.clear()
    elif isinstance(x, dict):
        for v in x.values():
            _empty(v)
        x.clear()


def _describe(x: Any, tensors: list[Any], count: list[int]) -> Any:
    count[0] += 1
    if count[0] > _MAX_NODES:
        raise ChannelProtocolError(f"payload has more than {_MAX_NODES} parts")
    if x is None or isinstance(x, (bool, int, float, str)):
        return ["v", x]
    if isinstance(x, tuple):  # torch.Size is a tuple
        return ["t", [_describe(v, tensors, count) for v in x]]
    if isinstance(x, list):
        return ["l", [_describe(v, tensors, count) for v in x]]
    if isinstance(x, dict):
        if not all(isinstance(k, str) for k in x):
            raise ChannelProtocolError("payload dicts must have string keys")
        return ["d", [[k, _describe(v, tensors, count)] for k, v in x.items()]]
    import torch

    if isinstance(x, torch.dtype):
        return ["y", str(x).removeprefix("torch.")]
    if isinstance(x, torch.device):
        return ["e", str(x)]
    if type(x) is torch.Tensor:
        if x.device.type != "cpu":
            raise ChannelProtocolError("payload tensors must be on the CPU")
        dtype = str(x.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise ChannelProtocolError(f"payload tensors of dtype {dtype} cannot be sent")
        tensors.append(x.contiguous())
        return ["T", dtype, list(x.shape), None]  # the offset is placed once all sizes are known
    raise ChannelProtocolError(f"a {type(x).__module__}.{type(x).__qualname__} cannot be sent")


def _place(tree: Any, offsets: Any) -> None:
    tag = tree[0]
    if tag == "T":
        tree[3] = next(offsets)
    elif tag in ("l", "t"):
        for v in tree[1]:
            _place(v, offsets)
    elif tag == "d":
        for _, v in tree[1]:
            _place(v, offsets)


def _build(node: Any, mm: mmap.mmap | None, total: int, count: list[int]) -> Any:
    count[0] += 1
    if count[0] > _MAX_NODES:
        raise ChannelProtocolError(f"payload has more than {_MAX_NODES} parts")
    if not isinstance(node, list) or not node or not isinstance(node[0], str):
        raise ChannelProtocolError("malformed payload node")
    tag = node[0]
    try:
        if tag == "v" and len(node) == 2 and (node[1] is None or isinstance(node[1], (bool, int, float, str))):
            return node[1]
        if tag in ("l", "t") and len(node) == 2 and isinstance(node[1], list):
            items = [_build(v, mm, total, count) for v in node[1]]
            return items if tag == "l" else tuple(items)
        if tag == "d" and len(node) == 2 and isinstance(node[1], list):
            out = {}
            for pair in node[1]:
                if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
                    raise ChannelProtocolError("malformed payload dict")
                out[pair[0]] = _build(pair[1], mm, total, count)
            return out
        if tag == "y" and len(node) == 2 and node[1] in _DTYPES:
            import torch

            return getattr(torch, node[1])
        if tag == "e" and len(node) == 2 and isinstance(node[1], str):
            import torch

            return torch.device(node[1])
        if tag == "T" and len(node) == 4:
            return _tensor(node, mm, total, count)
    except (RecursionError, TypeError, ValueError, RuntimeError) as e:
        if isinstance(e, ChannelProtocolError):
            raise
        raise ChannelProtocolError(f"malformed payload: {type(e).__name__}") from e
    raise ChannelProtocolError(f"malformed payload node {tag!r}")


def _tensor(node: list[Any], mm: mmap.mmap | None, total: int, count: list[int]) -> Any:
    import torch

    _, dtype_name, shape, offset = node
    if dtype_name not in _DTYPES or not isinstance(shape, list) or len(shape) > 64 or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ChannelProtocolError("malformed tensor in payload")
    dtype = getattr(torch, dtype_name)
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    if mm is None or not isinstance(offset, int) or isinstance(offset, bool) or offset < 0 or offset + nbytes > total:
        raise ChannelProtocolError("a payload tensor lies outside the payload")
    # Laid out as a sender lays them: in order, each at the aligned end of the one before. Two
    # nodes naming one range would make the judge copy it twice (a 3 GiB claim, 6 GiB copied).
    if offset != count[1]:
        raise ChannelProtocolError(f"a payload tensor starts at {offset}, not where the one before ended ({count[1]})")
    count[1] = offset + _aligned(nbytes)
    # Copied out at once: what the sender writes into the arena later changes nothing here.
    raw = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes, offset=offset)
    out = raw.clone()
    del raw
    return out.view(dtype).reshape(shape)
