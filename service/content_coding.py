"""Decoding a compressed HTTP answer from a party this service does not control (the model
provider, the identity provider) in bounded pieces, so that a size bound on what is read holds
for what the answer *decodes* to.

A compressed answer is a decompression bomb when its pieces are decoded whole: deflate shrinks a
run of one byte about 1000 times, so one 64 kB read off the socket can become 64 MB, and a few MB
on the wire gigabytes, before any bound counting the decoded bytes is checked. Callers ask for no
compression (``Accept-Encoding: identity``, :data:`IDENTITY`), but a server may compress anyway:
its answer is read raw and decoded here, never more than :data:`PIECE_BYTES` at a time, so the
caller's bound is checked as the decoded size grows. Only gzip and deflate are decoded (what a
server compressing unasked sends); any other coding (br, zstd, several stacked) is refused, as a
coding this module cannot decode within a bound.

:class:`BoundedBody` is the one reading of such an answer's body every caller shares (the proxy,
the JWKS fetch, the compaction model call): raw pieces in as they arrive, decoded here, refused
past a size bound on what they decode to, or past a deadline for the whole answer
(:func:`check_deadline`, also the check of a stream's deadline, piece by piece).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable, Iterator, Mapping

IDENTITY = {"Accept-Encoding": "identity"}  # the request header: no compression, please
PIECE_BYTES = 64 * 1024  # the most one step of decoding produces

_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class ContentCodingError(ValueError):
    """An answer in a coding that cannot be decoded within a bound, or that does not decode."""


class AnswerTooLarge(ValueError):
    """An answer past the caller's bound on what it decodes to (or announcing a length past it)."""

    def __init__(self, limit: int):
        super().__init__(f"the answer exceeds {limit} bytes")
        self.limit = limit


class AnswerTooSlow(ValueError):
    """An answer still arriving at the caller's deadline for all of it (a server trickling it:
    an HTTP client's timeout applies to each read, never to the whole answer)."""

    def __init__(self) -> None:
        super().__init__("the answer was still arriving at its deadline")


def check_deadline(deadline: float | None) -> None:
    """:class:`AnswerTooSlow` once ``deadline`` (a ``time.monotonic()`` value; None: no deadline)
    has passed: called as each piece of an answer arrives, a whole one's (:class:`BoundedBody`)
    or a stream's."""
    if deadline is not None and time.monotonic() > deadline:
        raise AnswerTooSlow


class BoundedDecoder:
    """One answer's gzip or deflate (zlib) coding, decoded in pieces of at most ``PIECE_BYTES``."""

    def __init__(self, coding: str):
        self.coding = coding
        self._zlib = zlib.decompressobj(_WBITS[coding])

    def decode(self, data: bytes) -> Iterator[bytes]:
        """What ``data`` (the next raw bytes) decodes to, piece by piece: what is not decoded yet
        stays in the decompressor, undecoded until the caller takes the next piece."""
        try:
            piece = self._zlib.decompress(data, PIECE_BYTES)
            while piece:
                yield piece
                piece = self._zlib.decompress(self._zlib.unconsumed_tail, PIECE_BYTES)
        except zlib.error as exc:
            raise ContentCodingError(f"the {self.coding} answer does not decode: {exc}") from exc


def decoder_for(content_encoding: str) -> BoundedDecoder | None:
    """The decoder of an answer with this ``Content-Encoding`` header value; None when it is not
    encoded (no header, or ``identity``)."""
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip().lower() not in ("", "identity")]
    if not codings:
        return None
    if len(codings) > 1 or codings[0] not in _WBITS:
        raise ContentCodingError(f"the answer's content coding {content_encoding!r} is not one this service reads")
    return BoundedDecoder(codings[0])


class BoundedBody:
    """One answer's body as its raw (maybe compressed) pieces arrive: decoded at most
    ``PIECE_BYTES`` at a time and kept up to ``limit`` decoded bytes, until ``deadline`` (a
    ``time.monotonic()`` value; checked as each piece arrives, so a read waiting for one ends at
    the HTTP client's own read timeout). Past either the caller stops reading and closes the
    answer. ``headers``: the answer's (its ``Content-Encoding``; a ``Content-Length`` past
    ``limit`` on an uncompressed answer is refused before a byte is read)."""

    def __init__(self, headers: Mapping[str, str], limit: int, *, deadline: float | None = None):
        self.limit = limit
        self._deadline = deadline
        self._decoder = decoder_for(headers.get("content-encoding", ""))
        declared = headers.get("content-length", "")
        if self._decoder is None and declared.isdigit() and int(declared) > limit:
            raise AnswerTooLarge(limit)
        self._parts: list[bytes] = []
        self.size = 0

    def add(self, raw: bytes) -> None:
        """Take the next raw piece; :class:`AnswerTooLarge`, :class:`AnswerTooSlow` or
        :class:`ContentCodingError` when the answer must not be read further."""
        check_deadline(self._deadline)
        for piece in self._decoder.decode(raw) if self._decoder else (raw,):
            self.size += len(piece)
            if self.size > self.limit:
                raise AnswerTooLarge(self.limit)
            self._parts.append(piece)

    def content(self) -> bytes:
        return b"".join(self._parts)


def read_bounded(
    raw: Iterable[bytes], headers: Mapping[str, str], limit: int, *, deadline: float | None = None
) -> bytes:
    """A synchronous answer's whole (decoded) body: ``raw`` its raw pieces (httpx's
    ``response.iter_raw()``: httpx would decode a compressed piece whole), within ``limit``
    decoded bytes and by ``deadline``; see :class:`BoundedBody`. The caller closes the answer
    (its connection then is not reused with the rest unread)."""
    body = BoundedBody(headers, limit, deadline=deadline)
    for piece in raw:
        body.add(piece)
    return body.content()
