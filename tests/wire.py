"""Reading HTTP/1.1 answers off a raw socket's stream, for tests that must see the exact bytes a
server or proxy sent (a cut body, a closed connection) rather than what a client library makes
of them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def read_head(stream: Any) -> bytes:
    """A response's status line and headers up to the blank line; empty when the peer closed first."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        byte = stream.read(1)
        if not byte:
            return b""
        head += byte
    return head


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def chunks(stream: Any) -> Iterator[bytes]:
    """A chunked body's chunks, decoded, as they are read (no trailers)."""
    while size := int(stream.readline().split(b";")[0], 16):
        yield stream.read(size)
        stream.readline()  # the chunk's CRLF
    stream.readline()  # the CRLF after the last, empty chunk


def read_chunks(stream: Any) -> bytes:
    """A chunked body, decoded (no trailers)."""
    return b"".join(chunks(stream))
