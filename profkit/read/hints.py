"""FLOP/byte hints carried in an NVTX range name.

Convention (documented in the README): a range named ``"attn.qkv {flops=1.2e12, bytes=3.4e9}"``
is the op ``attn.qkv`` and does 1.2e12 FLOPs and moves 3.4e9 bytes per instance. An optional
``precision=bf16`` names the compute roof to use. ``profkit.annotate(name, flops=, bytes=)`` writes
this form; any other tool can too, since it is only text.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Optional

from profkit.errors import ProfkitError

_HINT_RE = re.compile(r"^(?P<name>.*?)\s*\{(?P<body>[^{}]*)\}\s*$")
_PAIR_RE = re.compile(r"^\s*(?P<key>flops|bytes|precision)\s*=\s*(?P<value>[^,\s]+)\s*$")
PRECISIONS = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8")
# No single call of an op does more: 1e21 FLOPs is ~15 minutes at an H200's dense bf16 peak, and
# 1e21 bytes would take years at its HBM bandwidth. A larger hint is a typo (a missing "e").
MAX_HINT = 1e21


class HintError(ProfkitError):
    """A FLOP/byte hint in an NVTX range name that cannot be right."""


@dataclass(frozen=True)
class Hint:
    flops: Optional[float] = None
    bytes: Optional[float] = None
    precision: Optional[str] = None


def format_range_name(name: str, flops: Optional[float] = None, bytes: Optional[float] = None,
                      precision: Optional[str] = None) -> str:
    """The NVTX text for ``name`` carrying the given hints (``name`` alone when none are given)."""
    parts = []
    if flops is not None:
        parts.append(f"flops={float(flops):.6g}")
    if bytes is not None:
        parts.append(f"bytes={float(bytes):.6g}")
    if precision is not None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
        parts.append(f"precision={precision}")
    return f"{name} {{{', '.join(parts)}}}" if parts else name


def parse_range_name(text: str) -> tuple[str, Optional[Hint]]:
    """Split ``"name {flops=…, bytes=…}"`` into the op name and its hint; other text is left alone."""
    m = _HINT_RE.match(text)
    if not m:
        return text, None
    values: dict[str, object] = {}
    for pair in m.group("body").split(","):
        pm = _PAIR_RE.match(pair)
        if not pm:
            return text, None  # braces that are not ours: keep the name as the user wrote it
        key, raw = pm.group("key"), pm.group("value")
        if key == "precision":
            if raw not in PRECISIONS:
                return text, None
            values[key] = raw
        else:
            try:
                num = float(raw)
            except ValueError:
                return text, None
            if not 0 <= num <= MAX_HINT:  # rejects NaN, infinities, negatives and typos
                return text, None
            values[key] = num
    if not values:
        return text, None
    return m.group("name"), Hint(**values)  # type: ignore[arg-type]


def check_range_name(text: str) -> None:
    """Raise :class:`HintError` (one line) when ``text`` carries a hint with an impossible value:
    not a number, negative, NaN, infinite or beyond :data:`MAX_HINT`, or an unknown precision.
    Braces that do not hold our keys are the user's own text and pass."""
    m = _HINT_RE.match(text)
    if not m or parse_range_name(text)[1] is not None:
        return
    for pair in m.group("body").split(","):
        pm = _PAIR_RE.match(pair)
        if not pm:
            continue
        key, raw = pm.group("key"), pm.group("value")
        if key == "precision":
            if raw not in PRECISIONS:
                raise HintError(f"NVTX range {text!r}: precision={raw} is not one of "
                                f"{', '.join(PRECISIONS)}; fix the range name (profkit.annotate writes it)")
            continue
        try:
            num = float(raw)
        except ValueError:
            num = math.nan
        if not 0 <= num <= MAX_HINT:
            raise HintError(f"NVTX range {text!r}: {key}={raw} is not a count between 0 and "
                            f"{MAX_HINT:g} per call; fix the range name (profkit.annotate writes it)")
