"""Text helpers that respect what a reader sees as one character.

Python slices code points; a person reads graphemes. Cutting ``e`` + combining accent, an emoji
with its skin tone or ZWJ sequence, or a Hangul jamo sequence in the middle leaves a broken glyph,
so every place that shortens text for a person goes through :func:`clip`.
"""

from __future__ import annotations

import re
import unicodedata

_ZWJ = "\u200d"


def _extends_previous(char: str) -> bool:
    """Code points that never start a grapheme: combining marks (incl. Hangul vowel/final jamo and
    Indic vowel signs), variation selectors, emoji modifiers, the zero-width joiner."""
    if char == _ZWJ or "\ufe00" <= char <= "\ufe0f" or "\U0001f3fb" <= char <= "\U0001f3ff":
        return True
    if "\u1160" <= char <= "\u11ff":  # conjoining Hangul medial vowels and final consonants
        return True
    return unicodedata.category(char) in ("Mn", "Mc", "Me")


def clip(text: str, limit: int) -> str:
    """At most ``limit`` code points of ``text``, cut only between graphemes (shorter if needed)."""
    if len(text) <= limit:
        return text
    end = max(limit, 0)
    while end > 0 and (_extends_previous(text[end]) or text[end - 1] == _ZWJ):
        end -= 1
    return text[:end]


# Scripts written without spaces between words (Han, kana, Thai, Lao, Khmer, Myanmar) and Hangul,
# whose particles attach to the word before them: text containing any of them is segmented by
# OpenSearch's dictionary-based tokenizer, never by splitting on whitespace.
_UNSPACED_CLASS = (
    "["
    "\u0e00-\u0eff"  # Thai, Lao
    "\u1000-\u109f"  # Myanmar
    "\u1100-\u11ff"  # Hangul jamo
    "\u1780-\u17ff"  # Khmer
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3130-\u318f"  # Hangul compatibility jamo
    "\u31f0-\u31ff"  # Katakana phonetic extensions
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uac00-\ud7af"  # Hangul syllables
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\uff66-\uff9f"  # half-width katakana
    "\U00020000-\U0003134f"  # CJK extensions B-H
    "]"
)
_UNSPACED = re.compile(_UNSPACED_CLASS)
# a space with such a character on either side: optional in Japanese/Chinese (決済は Stripe = 決済はStripe)
_SPACE_BESIDE_UNSPACED = re.compile(rf"(?<={_UNSPACED_CLASS}) +| +(?={_UNSPACED_CLASS})")


_HANGUL = re.compile("[\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]")


def has_hangul(text: str) -> bool:
    """True when ``text`` contains Korean (Hangul syllables or jamo): its particles and endings
    attach to the word before them (``레디스의``), so it is also segmented by the Korean analyzer."""
    return _HANGUL.search(text) is not None


def has_unspaced_script(text: str) -> bool:
    """True when ``text`` contains a script that does not separate words with spaces."""
    return _UNSPACED.search(text) is not None


def drop_optional_spaces(text: str) -> str:
    """``text`` without the spaces next to a character of a script written without them: writers
    of Japanese and Chinese put spaces around embedded Latin words or leave them out freely."""
    return _SPACE_BESIDE_UNSPACED.sub("", text)
