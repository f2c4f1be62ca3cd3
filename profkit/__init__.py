"""profkit: profiling-driven analysis for PyTorch GPU work.

    >>> import profkit
    >>> prof = profkit.load("traces/micro_addnorm.sqlite.xz")
    >>> prof.ops(by="range")        # pandas DataFrame, one row per op with its verdict

The analyzer needs neither torch nor a GPU.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["load", "annotate", "Profile", "ProfkitError", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy: `import profkit` stays cheap, and `annotate` pulls in nvtx only when used.
    if name in ("load", "Profile"):
        from profkit import api
        return getattr(api, name)
    if name == "annotate":
        from profkit.capture.annotate import annotate
        return annotate
    if name == "ProfkitError":
        from profkit.errors import ProfkitError
        return ProfkitError
    raise AttributeError(f"module 'profkit' has no attribute {name!r}")
