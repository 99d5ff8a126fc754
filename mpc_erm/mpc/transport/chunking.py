"""Splitting a message into gRPC stream chunks and putting it back together.

gRPC's default 4 MiB message cap would make large shares fail (10^6 float64 = 8 MB), and one
huge message holds everything in memory twice on both sides; streaming bounded chunks keeps
every gRPC message small and lets the receiver fill a preallocated buffer.
"""

from __future__ import annotations

from collections.abc import Iterator

from .._proto import transport_pb2 as pb
from .errors import PayloadError

DEFAULT_CHUNK_BYTES = 1 << 20  # 1 MiB of payload per stream message
MAX_CHUNK_BYTES = 4 << 20  # what a receiver accepts per chunk, whatever the sender's setting
# Explicit gRPC message limits (both directions, server and channels): a chunk plus its header.
GRPC_MAX_MESSAGE_BYTES = MAX_CHUNK_BYTES + (64 << 10)


def grpc_message_options() -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
    ]


def chunk_count(nbytes: int, chunk_bytes: int) -> int:
    return max(1, -(-nbytes // chunk_bytes))


def iter_chunks(header: pb.Header, data: memoryview, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[pb.Chunk]:
    """Yield the header with the first slice, then the remaining slices (at least one chunk)."""
    if not 0 < chunk_bytes <= MAX_CHUNK_BYTES:
        raise ValueError(f"chunk size must be in (0, {MAX_CHUNK_BYTES}], got {chunk_bytes}")
    total = len(data)
    yield pb.Chunk(header=header, data=bytes(data[:chunk_bytes]))
    for off in range(chunk_bytes, total, chunk_bytes):
        yield pb.Chunk(data=bytes(data[off : off + chunk_bytes]))


class Assembler:
    """Collects the data of one message into a buffer of the size its header announced."""

    def __init__(self, total_bytes: int) -> None:
        self.buffer = bytearray(total_bytes)
        self.filled = 0
        self.chunks = 0

    def add(self, chunk: pb.Chunk) -> None:
        if self.chunks > 0 and chunk.HasField("header"):
            raise PayloadError("header repeated inside a message")
        n = len(chunk.data)
        if n > MAX_CHUNK_BYTES:
            raise PayloadError(f"chunk of {n} bytes exceeds {MAX_CHUNK_BYTES}")
        end = self.filled + n
        if end > len(self.buffer):
            raise PayloadError(f"message longer than its announced {len(self.buffer)} bytes")
        self.buffer[self.filled : end] = chunk.data
        self.filled = end
        self.chunks += 1

    def finish(self) -> bytearray:
        if self.filled != len(self.buffer):
            raise PayloadError(f"message ended after {self.filled} of {len(self.buffer)} announced bytes")
        return self.buffer
