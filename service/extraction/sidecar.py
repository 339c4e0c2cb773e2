"""The in-band sidecar (paper §4.1): split it off a complete answer, or strip it from a stream.

The answering model appends ``<<<SIDECAR_JSON>>>{...}<<<END_SIDECAR>>>`` after its visible answer.
The *last* begin marker counts; a missing end marker means the block ran to the end of the text
(``needs_repair``); no begin marker means ``missing``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

BEGIN = "<<<SIDECAR_JSON>>>"
END = "<<<END_SIDECAR>>>"


class ParseStatus(StrEnum):
    PARSED = "parsed"
    NEEDS_REPAIR = "needs_repair"
    MISSING = "missing"


@dataclass(frozen=True)
class SplitResult:
    visible: str
    raw: str | None
    status: ParseStatus


def split_sidecar(text: str) -> SplitResult:
    """Visible text (right-trimmed) and the raw block after the last begin marker."""
    at = text.rfind(BEGIN)
    if at < 0:
        return SplitResult(visible=text, raw=None, status=ParseStatus.MISSING)
    visible = text[:at].rstrip()
    rest = text[at + len(BEGIN) :]
    end = rest.find(END)
    if end < 0:
        return SplitResult(visible=visible, raw=rest.strip(), status=ParseStatus.NEEDS_REPAIR)
    return SplitResult(visible=visible, raw=rest[:end].strip(), status=ParseStatus.PARSED)


class StreamStripper:
    """Forward a streamed answer while never emitting any part of the sidecar.

    It holds back the longest suffix of what it has seen that is a prefix of the begin marker
    (at most ``len(BEGIN) - 1`` characters, plus trailing whitespace), so a marker split over
    any chunk boundaries is never forwarded; once the marker is complete nothing more is
    emitted. The full text is kept for :func:`split_sidecar` at the end of the stream.
    """

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._pending = ""
        self._closed = False

    @property
    def full_text(self) -> str:
        return "".join(self._parts)

    @property
    def marker_seen(self) -> bool:
        return self._closed

    def feed(self, chunk: str) -> str:
        """Take one chunk; return the text that may be shown now (possibly empty)."""
        if not chunk:
            return ""
        self._parts.append(chunk)
        if self._closed:
            return ""
        buf = self._pending + chunk
        at = buf.find(BEGIN)
        if at >= 0:
            self._closed = True
            self._pending = ""
            return buf[:at].rstrip()
        keep = _held_back(buf)
        self._pending = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def finish(self) -> str:
        """End of stream: release a held-back tail that turned out not to be a marker."""
        if self._closed:
            return ""
        tail, self._pending = self._pending, ""
        return tail


def _held_back(buf: str) -> int:
    """How many trailing characters to hold: the longest suffix that is a proper prefix of
    :data:`BEGIN`, plus the whitespace before it (the visible answer is right-trimmed before a
    sidecar, as in :func:`split_sidecar`)."""
    keep = 0
    for size in range(min(len(buf), len(BEGIN) - 1), 0, -1):
        if BEGIN.startswith(buf[-size:]):
            keep = size
            break
    while keep < len(buf) and buf[len(buf) - keep - 1].isspace():
        keep += 1
    return keep
