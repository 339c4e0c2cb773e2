"""Query clean-up before search (paper §3.5): keep the words a person typed, drop the noise.

Code, URLs, paths, stack traces, hex ids and numbers carry no belief names but plenty of tokens
that could fuzzy-match by accident, so they go. Short messages pass through raw ("k8s?").
"""

from __future__ import annotations

import re
from collections.abc import Callable
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
# The segment before a path's first slash is possessive (``++``): "/" is no _SEG, so giving a
# character back could never let the slash match, and trying it cost a long message ~30 us.
_PATH = re.compile(
    rf"(?<!\S)(?:(?:~|\.{{1,2}})?/{_SEG}+(?:/{_SEG}*)*|{_SEG}++(?:/{_SEG}+){{2,}}|{_SEG}++/{_SEG}+\.[a-z]{{1,5}})(?=[?!.,;:]*(?:\s|$))"
)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_HEADER = re.compile(r"^\s{0,3}#{1,6}\s*", re.MULTILINE)
# Three patterns below start with the character every match starts with, and check what comes
# before it once it is consumed (``_(?<!\w_)`` is ``(?<!\w)_``): re then scans for that character
# at C speed instead of trying each position (on a long message: emphasis ~7x, hex ids and numbers
# ~1.7x faster). Same matches as
# ``\*{1,3}|(?<!\w)_{1,3}|_{1,3}(?!\w)``, ``\b(?:0x)?[0-9a-fA-F]{8,}\b`` and
# ``(?<![\w.])\d+(?:[.,]\d+)*(?![\w])`` (tests/test_query_cleanup.py compares them).
_EMPHASIS = re.compile(r"\*\*{0,2}|_(?<!\w_)_{0,2}|__{0,2}(?!\w)")
_HTML = re.compile(r"</?[a-zA-Z][^>\n]*>")
_HEX = re.compile(r"[0-9a-fA-F](?<!\w.)(?:(?<=0)x[0-9a-fA-F]{8,}|[0-9a-fA-F]{7,})\b")
_INTEGER = re.compile(r"\d(?<![\w.]\d)\d*(?:[.,]\d+)*(?![\w])")
_TRAILING_PUNCT = re.compile(r"[?!.,;:]+(?=\s|$)")
_DIGIT = re.compile(r"\d")  # what _INTEGER needs at least once


def _holds(*literals: str) -> Callable[[str], bool]:
    """A check that is False only when the text holds none of ``literals``: then a pattern that
    cannot match without one of them is skipped (its ``sub`` would return the text unchanged).
    Scanning for a literal is C speed; a pattern tried at every position of a long message is not
    (a long message's clean-up was ~0.3 ms, most of it in patterns that found nothing)."""
    return lambda text: any(literal in text for literal in literals)


def _has_www(text: str) -> bool:
    # _URL ignores case, but only ASCII w and W fold to w: lower() cannot hide a match
    return "://" in text or "www." in text.lower()


def _has_file_ref(text: str) -> bool:
    return "." in text and ("[" in text or "<" in text)


def _has_digit(text: str) -> bool:
    return _DIGIT.search(text) is not None


def _always(_text: str) -> bool:
    return True


# The clean-up in order: each pattern, what replaces a match, and a necessary condition for it to
# match (every match of the pattern contains one of the literals). The order matters: a pattern
# sees the text the ones before it left.
_NOISE: tuple[tuple[re.Pattern[str], str, Callable[[str], bool]], ...] = (
    (_FENCED, " ", _holds("```", "~~~")),
    (_INDENTED_CODE, " ", _holds("    ", "\t")),
    (_FILE_REF, " ", _has_file_ref),
    (_STACK_LINE, " ", _holds("at")),
    (_URL, " ", _has_www),
    (_INLINE_CODE, " ", _holds("`")),
    (_PATH, " ", _holds("/")),
    (_HTML, " ", _holds("<")),
    (_HEADER, " ", _holds("#")),
    (_EMPHASIS, "", _holds("*", "_")),
    (_HEX, " ", _always),
    (_INTEGER, " ", _has_digit),
    (_TRAILING_PUNCT, "", _always),
)


# How far back a clamp may go to end on a space. Japanese or Chinese text has few or none, so
# beyond this it is cut between two graphemes instead of losing most of the message.
_MAX_WORD_TAIL = 40


def _clamp(text: str, max_chars: int) -> str:
    window = text[:max_chars]
    if text[max_chars] == " ":  # the window ends a word (white space is single spaces by now)
        return window
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
    for pattern, replacement, may_match in _NOISE:
        if may_match(text):
            text = pattern.sub(replacement, text)
    # runs of white space to one space, none at either end: str.split's white space is re's \s
    text = " ".join(text.split())
    clamped = len(text) > max_chars
    if clamped:
        # front-biased: the intent of a message is usually stated first
        text = _clamp(text, max_chars)
    return CleanQuery(text=text, raw_length=len(raw), was_noisy=len(text) < 0.5 * len(stripped), clamped=clamped)
