"""Text that is safe to print: names come from the traced program and may hold anything.

An NVTX range name is whatever the program passed to ``nvtx.push_range``: it can hold terminal
escape sequences (which would recolour or rewrite the user's terminal), newlines (which would
break a one-line error or a CSV row's meaning) or bidirectional overrides (which make text read
differently from what it is). :func:`visible` shows each such character as a ``\\xNN`` /
``\\uNNNN`` escape instead, so nothing is lost and nothing acts.
"""
from __future__ import annotations

import re

# C0 controls, DEL, C1 controls (0x80-0x9f, including the 8-bit CSI 0x9b), and the Unicode
# format characters that reorder or hide text (bidi embeddings/overrides/isolates, line and
# paragraph separators, zero-width marks).
CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def visible(text: object) -> str:
    """``text`` as a string with every control or format character shown as an escape."""
    s = text if isinstance(text, str) else as_text(text)
    return CONTROL_RE.sub(_escape, s)


def as_text(value: object) -> str:
    """Any SQLite value as text: bytes decoded with replacement, never an exception."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    return "" if value is None else str(value)


def one_line(text: object, limit: int = 1000) -> str:
    """A message fit for one terminal line: controls made visible, whitespace runs collapsed."""
    s = visible(re.sub(r"[\r\n\t]+", " ", as_text(text)))
    return s if len(s) <= limit else s[: limit - 1] + "…"
