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
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

IDENTITY = {"Accept-Encoding": "identity"}  # the request header: no compression, please
PIECE_BYTES = 64 * 1024  # the most one step of decoding produces

_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class ContentCodingError(ValueError):
    """An answer in a coding that cannot be decoded within a bound, or that does not decode."""


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
