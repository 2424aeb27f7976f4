"""Frames between the node and its network process: a 4-byte big-endian length, then
one MessagePack value (a list whose first item names the frame)."""

from __future__ import annotations

import struct
from typing import Any, BinaryIO

import msgpack
import trio

MAX_FRAME = 16 * 2**20
_LEN = struct.Struct(">I")


def pack(frame: list[Any]) -> bytes:
    body = msgpack.packb(frame, use_bin_type=True)
    return _LEN.pack(len(body)) + body


def _unpack(body: bytes) -> list[Any]:
    frame = msgpack.unpackb(body, raw=False)
    if not isinstance(frame, list) or not frame or not isinstance(frame[0], str):
        raise ValueError("not a frame")
    return frame


def read_frame(stream: BinaryIO) -> list[Any] | None:
    """One frame from a blocking binary stream; None at end of stream."""
    head = stream.read(_LEN.size)
    if len(head) < _LEN.size:
        return None
    (size,) = _LEN.unpack(head)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    body = stream.read(size)
    if len(body) < size:
        return None
    return _unpack(body)


class FrameReader:
    """Frames from a trio receive stream."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream, self.buffer = stream, bytearray()

    async def _fill(self, n: int) -> bool:
        while len(self.buffer) < n:
            chunk = await self.stream.receive_some(1 << 16)
            if not chunk:
                return False
            self.buffer += chunk
        return True

    async def receive(self) -> list[Any] | None:
        if not await self._fill(_LEN.size):
            return None
        (size,) = _LEN.unpack(self.buffer[: _LEN.size])
        if size > MAX_FRAME:
            raise ValueError(f"frame of {size} bytes")
        if not await self._fill(_LEN.size + size):
            return None
        body = bytes(self.buffer[_LEN.size : _LEN.size + size])
        del self.buffer[: _LEN.size + size]
        return _unpack(body)


class PeerGone(Exception):
    """The other end of the pipe has closed (for the network process: its node exited)."""


class FrameWriter:
    """Frames to a trio send stream, one writer at a time."""

    def __init__(self, stream: trio.abc.SendStream) -> None:
        self.stream, self.lock = stream, trio.Lock()

    async def send(self, frame: list[Any]) -> None:
        async with self.lock:
            try:
                await self.stream.send_all(pack(frame))
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise PeerGone from exc
