"""A compressed answer is decoded in bounded pieces (``service.content_coding``): a bomb never
decodes to more than ``PIECE_BYTES`` at a time, however much of it arrived in one read."""

from __future__ import annotations

import gzip
import itertools
import zlib

import pytest

from service.content_coding import PIECE_BYTES, ContentCodingError, decoder_for

MiB = 1024 * 1024


def bomb(decoded_mib: int, wbits: int) -> bytes:
    """``decoded_mib`` MiB of one byte, compressed (about 1000 times smaller)."""
    coder = zlib.compressobj(9, zlib.DEFLATED, wbits)
    block = b"\0" * MiB
    return b"".join(coder.compress(block) for _ in range(decoded_mib)) + coder.flush()


@pytest.mark.parametrize(("coding", "wbits"), [("gzip", 16 + zlib.MAX_WBITS), ("deflate", zlib.MAX_WBITS)])
def test_a_bomb_read_whole_decodes_one_bounded_piece_at_a_time(coding: str, wbits: int) -> None:
    data = bomb(256, wbits)
    assert len(data) < MiB  # one read's worth, or a few
    decoder = decoder_for(coding)
    assert decoder is not None
    pieces = decoder.decode(data)
    first = list(itertools.islice(pieces, 16))  # what a reader takes before its bound stops it
    assert all(len(piece) <= PIECE_BYTES for piece in first)
    assert sum(map(len, first)) == 16 * PIECE_BYTES
    # what is left is still compressed: decoding it all gives the rest, piece by piece
    rest = 0
    for piece in pieces:
        assert len(piece) <= PIECE_BYTES
        rest += len(piece)
    assert sum(map(len, first)) + rest == 256 * MiB


def test_an_answer_in_several_reads_decodes_to_itself() -> None:
    text = b"Use allkeys-lru. " * 10_000
    data = gzip.compress(text)
    decoder = decoder_for("GZIP")
    assert decoder is not None
    decoded = b"".join(piece for i in range(0, len(data), 7) for piece in decoder.decode(data[i : i + 7]))
    assert decoded == text


@pytest.mark.parametrize("header", ["", "identity", " Identity "])
def test_an_answer_not_encoded_needs_no_decoder(header: str) -> None:
    assert decoder_for(header) is None


@pytest.mark.parametrize("header", ["br", "zstd", "gzip, gzip", "compress", "gzip, br"])
def test_a_coding_that_cannot_be_decoded_within_a_bound_is_refused(header: str) -> None:
    with pytest.raises(ContentCodingError):
        decoder_for(header)


def test_a_broken_compressed_answer_is_refused() -> None:
    decoder = decoder_for("gzip")
    assert decoder is not None
    with pytest.raises(ContentCodingError):
        list(decoder.decode(b"not gzip at all"))
