"""Query clean-up before search (paper §3.5): keep the words a person typed, drop the noise.

Code, URLs, paths, stack traces, hex ids and numbers carry no belief names but plenty of tokens
that could fuzzy-match by accident, so they go. Short messages pass through raw ("k8s?").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.domain.text import clip, has_unspaced_script

MIN_RAW_CHARS = 16

_FENCED = re.compile(r"(```|~~~)[\s\S]*?(\1|$)")
_INDENTED_CODE = re.compile(r"^(?: {4,}|\t).*$", re.MULTILINE)
_FILE_REF = re.compile(
    r"[\[<][^\]>\n]*\.(?:ts|tsx|js|jsx|py|json|toml|yaml|yml|md|txt|csv|pdf|png|jpg|jpeg|svg)[\]>]", re.IGNORECASE
)
_STACK_LINE = re.compile(r"^\s+at\s.*$", re.MULTILINE)
_URL = re.compile(r"\b(?:https?|ftp|file)://\S+|\bwww\.\S+", re.IGNORECASE)
# A path segment is ASCII or Latin letters, digits and ``_.@-`` (for ASCII text exactly ``\w``):
# Japanese or Chinese text has no spaces, so ``数据库/缓存/队列`` is a list of words, not a path.
_SEG = r"[A-Za-z0-9_.@\-\u00c0-\u024f]"
_PATH = re.compile(
    rf"(?<!\S)(?:(?:~|\.{{1,2}})?/{_SEG}+(?:/{_SEG}*)*|{_SEG}+(?:/{_SEG}+){{2,}}|{_SEG}+/{_SEG}+\.[a-z]{{1,5}})(?=[?!.,;:]*(?:\s|$))"
)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_HEADER = re.compile(r"^\s{0,3}#{1,6}\s*", re.MULTILINE)
_EMPHASIS = re.compile(r"\*{1,3}|(?<!\w)_{1,3}|_{1,3}(?!\w)")
_HTML = re.compile(r"</?[a-zA-Z][^>\n]*>")
_HEX = re.compile(r"\b(?:0x)?[0-9a-fA-F]{8,}\b")
_INTEGER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?![\w])")
_TRAILING_PUNCT = re.compile(r"[?!.,;:]+(?=\s|$)")
_SPACES = re.compile(r"\s+")


# How far back a clamp may go to end on a space. Japanese or Chinese text has few or none, so
# beyond this it is cut between two graphemes instead of losing most of the message.
_MAX_WORD_TAIL = 40


def _clamp(text: str, max_chars: int) -> str:
    window = text[:max_chars]
    head = window.rsplit(" ", 1)[0]
    no_space = head == window
    if no_space or (max_chars - len(head) > _MAX_WORD_TAIL and has_unspaced_script(window)):
        return clip(text, max_chars)
    return head


@dataclass(frozen=True)
class CleanQuery:
    text: str
    raw_length: int
    was_noisy: bool
    clamped: bool


def clean_query(message: str, *, max_chars: int = 1000) -> CleanQuery:
    raw = message or ""
    stripped = raw.strip()
    if len(stripped) < MIN_RAW_CHARS:
        return CleanQuery(text=stripped, raw_length=len(raw), was_noisy=False, clamped=False)
    text = stripped
    for pattern in (_FENCED, _INDENTED_CODE, _FILE_REF, _STACK_LINE, _URL, _INLINE_CODE, _PATH, _HTML, _HEADER):
        text = pattern.sub(" ", text)
    text = _EMPHASIS.sub("", text)
    text = _HEX.sub(" ", text)
    text = _INTEGER.sub(" ", text)
    text = _TRAILING_PUNCT.sub("", text)
    text = _SPACES.sub(" ", text).strip()
    clamped = len(text) > max_chars
    if clamped:
        # front-biased: the intent of a message is usually stated first
        text = _clamp(text, max_chars)
    return CleanQuery(text=text, raw_length=len(raw), was_noisy=len(text) < 0.5 * len(stripped), clamped=clamped)
