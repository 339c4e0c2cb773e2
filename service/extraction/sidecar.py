"""The in-band sidecar (paper §4.1): split it off a complete answer, or strip it from a stream.

The answering model appends ``<<<SIDECAR_JSON>>>{...}<<<END_SIDECAR>>>`` after its visible answer.
The *last* begin marker counts; a missing end marker means the block ran to the end of the text
(``needs_repair``); no begin marker means ``missing``.

Only a block the model produced itself counts: a block whose JSON is text of the injected context
(a colleague's belief the model echoed back) is not this turn's sidecar, it is dropped from the
visible answer and reported as ``missing``. Stored belief text cannot carry the markers at all
(:mod:`service.domain.visible_text`), and the injection escapes them (:mod:`service.recall.render`);
this is the last line.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

BEGIN = "<<<SIDECAR_JSON>>>"
END = "<<<END_SIDECAR>>>"
MIN_ECHO_CHARS = 16


class ParseStatus(StrEnum):
    PARSED = "parsed"
    NEEDS_REPAIR = "needs_repair"
    MISSING = "missing"


@dataclass(frozen=True)
class SplitResult:
    visible: str
    raw: str | None
    status: ParseStatus


def _squeezed(text: str) -> str:
    return " ".join(text.split())


def echoes_injection(raw: str, injected: Iterable[str]) -> bool:
    """Whether the block is (whitespace aside) text the injected context carried."""
    block = _squeezed(raw)
    # a trivial block ("{}") is in too many texts to say anything, and carries nothing anyway
    return len(block) >= MIN_ECHO_CHARS and any(block in _squeezed(text) for text in injected)


def split_sidecar(text: str, injected: Iterable[str] = ()) -> SplitResult:
    """Visible text (right-trimmed) and the raw block after the last begin marker; ``injected``
    is the text of the beliefs the turn's context carried (an echo of them is no sidecar)."""
    at = text.rfind(BEGIN)
    if at < 0:
        return SplitResult(visible=text, raw=None, status=ParseStatus.MISSING)
    visible = text[:at].rstrip()
    rest = text[at + len(BEGIN) :]
    end = rest.find(END)
    raw = rest.strip() if end < 0 else rest[:end].strip()
    if echoes_injection(raw, injected):
        return SplitResult(visible=visible, raw=None, status=ParseStatus.MISSING)
    if end < 0:
        return SplitResult(visible=visible, raw=raw, status=ParseStatus.NEEDS_REPAIR)
    return SplitResult(visible=visible, raw=raw, status=ParseStatus.PARSED)


def split_blocks(content: list[Any], injected: Iterable[str] = ()) -> tuple[list[Any], SplitResult]:
    """An answer given as content blocks (Anthropic's ``content``; OpenAI's ``message.content``
    as a list of parts, which some providers send): the blocks with the sidecar removed, and the
    split of their text joined (:func:`answer_text`) for the turn record. The text block holding
    the last begin marker keeps only what precedes it (dropped when nothing does), later text
    blocks belong to the sidecar; tool use and every other block stay as they are."""
    injected = list(injected)
    split = split_sidecar(answer_text([b["text"] for b in content if is_text_block(b)]), injected)
    texts = [i for i, b in enumerate(content) if is_text_block(b)]
    marked = [i for i in texts if BEGIN in content[i]["text"]]
    if not marked:
        return content, split
    cut = marked[-1]
    out: list[Any] = []
    for i, block in enumerate(content):
        if i == cut:
            visible = split_sidecar(block["text"], injected).visible
            if visible:
                out.append({**block, "text": visible})
        elif not (i > cut and i in texts):
            out.append(block)
    return out, split


def is_text_block(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)


def answer_text(texts: list[str]) -> str:
    """The answer as one text for :func:`split_sidecar` and the turn record."""
    return "\n\n".join(t for t in texts if t)


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
    # rstrip, not a loop over the characters: whitespace already held back is scanned again with
    # every chunk (a model streaming whitespace cost a Python step per held character per chunk)
    head = buf[: len(buf) - keep]
    return keep + len(head) - len(head.rstrip())
