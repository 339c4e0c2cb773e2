"""Letter-only, mutually distant words for the names and aliases the load test writes.

The analyzer splits names at letter/digit boundaries and recall matches query words of four or
more characters with one edit of fuzz, so every word the load test must find again is made of
letters only, and any two of its words differ by at least two edits (substitution or adjacent
transposition): recalling one alias can then never pull in a thousand near neighbours that push
the wanted belief out of the budget.
"""

from __future__ import annotations

import secrets

# Base 23 (a..w) with a weighted check letter mod 23: 23 is prime and the weights 1..5 are
# distinct and non-zero mod 23, so changing one digit or swapping two adjacent different digits
# always changes the check letter; codewords are therefore at least two edits apart.
_ALPHABET = "abcdefghijklmnopqrstuvw"
_BASE = len(_ALPHABET)
_DIGITS = 5
CAPACITY = _BASE**_DIGITS


def codeword(n: int) -> str:
    """The n-th six-letter codeword (five base-23 digits and a check letter)."""
    if not 0 <= n < CAPACITY:
        raise ValueError(f"codeword index {n} out of range")
    digits = []
    for _ in range(_DIGITS):
        n, digit = divmod(n, _BASE)
        digits.append(digit)
    digits.reverse()
    check = sum((i + 1) * d for i, d in enumerate(digits)) % _BASE
    return "".join(_ALPHABET[d] for d in [*digits, check])


def run_tag(length: int = 4) -> str:
    """Random letters that keep two runs against the same store apart (not derived from the seed)."""
    return "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(length))


def tenant_word(tag: str, tenant_index: int) -> str:
    """The word that names a tenant's beliefs: the run tag plus a codeword (letters only)."""
    return f"t{tag}{codeword(tenant_index)}"


def write_word(n: int) -> str:
    return f"w{codeword(n)}"


def seed_word(n: int) -> str:
    return f"s{codeword(n)}"


def turn_token(tag: str, n: int) -> str:
    """A turn marker token: 6-40 lowercase letters, unique per run."""
    return f"{tag}x{codeword(n)}"
