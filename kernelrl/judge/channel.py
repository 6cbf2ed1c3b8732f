"""The private message channel between the judge and a worker process.

A message is a JSON header plus an optional tensor payload, framed with explicit lengths and
sent over a pipe the judge created and passed to the worker by file descriptor (never stdin or
stdout, which the candidate's prints would pollute).

Guarantees for the judging side:
- nothing received is ever unpickled as arbitrary objects: headers are JSON, payloads are read
  with `torch.load(weights_only=True)`, which admits plain tensors and containers only, so a
  Tensor subclass or a crafted object cannot execute code in the judge;
- sizes are bounded (`MAX_HEADER_BYTES`, `max_payload_bytes`), so a worker cannot exhaust the
  judge's memory with one frame;
- `recv` honours a deadline and reports a closed pipe as `ChannelClosed`.

Does not authenticate the worker: the candidate runs inside the worker and could write frames of
its own. The judge therefore drives the protocol (a reply is accepted only as the answer to the
request just sent) and never trusts a worker's claim it can check itself (outputs are compared
in the judge, timings are cross-checked against the judge's own clock).
"""

from __future__ import annotations

import io
import json
import os
import select
import struct
import time
from dataclasses import dataclass
from typing import Any

_FRAME = struct.Struct(">IQ")  # header length, payload length
MAX_HEADER_BYTES = 8 << 20
DEFAULT_MAX_PAYLOAD_BYTES = 16 << 30


class ChannelClosed(EOFError):
    """The other side closed its end (it exited or crashed)."""


class ChannelTimeout(TimeoutError):
    """No complete message arrived before the deadline."""


class ChannelProtocolError(ValueError):
    """A frame was malformed or too large."""


@dataclass(frozen=True)
class Message:
    kind: str
    header: dict[str, Any]
    payload: Any = None


class Channel:
    def __init__(self, read_fd: int, write_fd: int, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES):
        self.read_fd = read_fd
        self.write_fd = write_fd
        self.max_payload_bytes = max_payload_bytes

    def send(self, kind: str, header: dict[str, Any] | None = None, payload: Any = None) -> None:
        head = json.dumps({"kind": kind, **(header or {})}).encode()
        body = b""
        if payload is not None:
            import torch

            buf = io.BytesIO()
            torch.save(payload, buf)
            body = buf.getvalue()
        # the frame and header first, then the body as it is: no copy of a large payload
        for part in (_FRAME.pack(len(head), len(body)) + head, body):
            view = memoryview(part)
            while view:
                n = os.write(self.write_fd, view)
                view = view[n:]

    def recv(self, deadline: float | None = None) -> Message:
        head_len, body_len = _FRAME.unpack(self._read_exact(_FRAME.size, deadline))
        if head_len > MAX_HEADER_BYTES or body_len > self.max_payload_bytes:
            raise ChannelProtocolError(f"frame too large: header {head_len} B, payload {body_len} B")
        try:
            header = json.loads(self._read_exact(head_len, deadline))
        except json.JSONDecodeError as e:
            raise ChannelProtocolError(f"malformed header: {e}") from e
        if not isinstance(header, dict) or not isinstance(header.get("kind"), str):
            raise ChannelProtocolError("header is not an object with a 'kind'")
        payload = None
        if body_len:
            import torch

            raw = self._read_exact(body_len, deadline)
            try:
                payload = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
            except Exception as e:  # noqa: BLE001 - anything unloadable is a protocol violation
                raise ChannelProtocolError(f"payload rejected: {type(e).__name__}: {e}") from e
        kind = header.pop("kind")
        return Message(kind=kind, header=header, payload=payload)

    def _read_exact(self, n: int, deadline: float | None) -> bytes | bytearray:
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
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
