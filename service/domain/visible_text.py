"""Free text as it may be stored and shown: no invisible steering, no prompt structure.

Belief text written by one member reaches colleagues' terminals, consoles and system prompts.
:func:`visible_text` is applied at write (by the belief model) and is idempotent, so a stored
document read back gives the same text:

- control characters (C0 and C1, NUL, DEL) are removed, except newline and tab; ANSI escape
  sequences are removed whole, not just their ESC;
- bidirectional embeddings, overrides and isolates (the "Trojan Source" characters) and the
  invisible zero-width space, word joiner and byte-order mark are removed. The zero-width
  (non-)joiners stay: scripts and emoji sequences need them;
- unpaired UTF-16 surrogates (a JSON ``"\\ud800"`` escape decodes to one) are removed: they are no
  character, no UTF-8 encoder takes them, and one in an alias used to fail the write with a 500;
- runs of three or more ``<`` or ``>`` are shortened to two, so no stored text can carry the
  sidecar's ``<<<SIDECAR_JSON>>>`` / ``<<<END_SIDECAR>>>`` markers;
- leading and trailing whitespace (any Unicode whitespace) is trimmed.

Tags such as ``</pinned_facts>`` are left in the text (people write about markup) and escaped
where text is rendered into a prompt (:mod:`service.recall.render`).
"""

from __future__ import annotations

import re

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), and two-character escapes (ESC + one byte).
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_INVISIBLE = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200b\u2060\ufeff"
_CONTROL = "".join(chr(c) for c in (*range(0x00, 0x20), *range(0x7F, 0xA0)) if chr(c) not in "\n\t")
_DROP = str.maketrans("", "", _INVISIBLE + _CONTROL)
_MARKER_RUNS = re.compile(r"<{3,}|>{3,}")
_SURROGATES = re.compile("[\ud800-\udfff]")


def visible_text(value: str) -> str:
    """``value`` without control, bidi-override or marker sequences, trimmed (see module doc)."""
    text = _ANSI.sub("", value.replace("\r\n", "\n").replace("\r", "\n"))
    text = _SURROGATES.sub("", text.translate(_DROP))
    text = _MARKER_RUNS.sub(lambda m: m.group(0)[:2], text)
    return text.strip()


def has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds an unpaired UTF-16 surrogate (see the module doc)."""
    return _SURROGATES.search(text) is not None


def has_control_or_surrogate(text: str) -> bool:
    """Whether ``text`` holds a control character (newline and tab included) or an unpaired
    surrogate: what an identifier sent on in a header or a JSON answer must never carry."""
    return _CONTROL_OR_SURROGATE.search(text) is not None


_CONTROL_OR_SURROGATE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
