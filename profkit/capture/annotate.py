"""``profkit.annotate``: mark a region with an NVTX range that carries FLOP/byte hints.

    with profkit.annotate("attn.qkv", flops=2 * B * S * D * 3 * D, bytes=..., precision="bf16"):
        qkv = x @ w_qkv

    @profkit.annotate("mlp", flops=...)
    def mlp(x): ...

    @profkit.annotate                     # the range is named after the function
    def step(): ...

The range text is :func:`profkit.read.hints.format_range_name` (``"attn.qkv {flops=…, bytes=…}"``),
which ``profkit classify`` reads back. Built on the ``nvtx`` package: with no profiler attached
(or no GPU) a push/pop costs well under a microsecond and does nothing else. When the ``nvtx``
package is missing the ranges are skipped and the code still runs.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Optional, Union

from profkit.read.hints import format_range_name

try:  # the nvtx package is a dependency, but annotated code must never fail for want of it
    import nvtx as _nvtx
except Exception:  # pragma: no cover - exercised only without the package
    _nvtx = None


class annotate(contextlib.ContextDecorator):
    """Context manager and decorator: an NVTX push/pop range named with the hints."""

    def __new__(cls, name: Union[str, Callable[..., Any]] = None, *args: Any, **kwargs: Any):
        if callable(name) and not isinstance(name, str):  # bare @annotate on a function
            func = name
            inst = super().__new__(cls)
            inst.__init__(getattr(func, "__qualname__", getattr(func, "__name__", "function")))
            return inst(func)
        return super().__new__(cls)

    def __init__(self, name: str, flops: Optional[float] = None, bytes: Optional[float] = None,
                 precision: Optional[str] = None, *, color: Optional[Union[str, int]] = None,
                 domain: Optional[str] = None, category: Optional[Union[str, int]] = None) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError("profkit.annotate needs a range name (a non-empty string)")
        for key, value in (("flops", flops), ("bytes", bytes)):
            if value is not None and not float(value) >= 0:
                raise ValueError(f"{key} must be a number >= 0, not {value!r}")
        self.name = name
        self.message = format_range_name(name, flops=flops, bytes=bytes, precision=precision)
        self.color = color
        self.domain = domain
        self.category = category

    def __enter__(self) -> "annotate":
        if _nvtx is not None:
            _nvtx.push_range(self.message, color=self.color, domain=self.domain,
                             category=self.category)
        return self

    def __exit__(self, *exc: Any) -> bool:
        if _nvtx is not None:
            _nvtx.pop_range(domain=self.domain)
        return False

    def __call__(self, func: Callable[..., Any]) -> Callable[..., Any]:
        wrapped = super().__call__(func)
        return functools.wraps(func)(wrapped)

    def __repr__(self) -> str:
        return f"profkit.annotate({self.message!r})"
