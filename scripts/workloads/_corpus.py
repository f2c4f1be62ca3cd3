"""What the what-if corpus programs (``w_*.py``) share: the NVTX range helper and the ``--fix``
parser. The programs import it as a sibling module (a script's folder is first on sys.path)."""
from __future__ import annotations

import argparse
import contextlib

import torch


def nvtx(name: str):
    """An NVTX range (nothing where CUDA is absent, for CPU smoke runs)."""
    return torch.cuda.nvtx.range(name) if torch.cuda.is_available() else contextlib.nullcontext()


def parse_fixes(ap: argparse.ArgumentParser, args: argparse.Namespace, known, cuda_only=(),
                alternatives=()) -> set[str]:
    """The fixes asked for (``--fix`` repeatable or comma-separated), checked: each known, the
    CUDA-only ones not on the CPU, no two of one set of ``alternatives`` together."""
    fixes = {f.strip() for v in args.fix for f in v.split(",") if f.strip()}
    if fixes - set(known):
        ap.error(f"unknown fix {sorted(fixes - set(known))}; known: {', '.join(known)}")
    if args.device == "cpu" and fixes & set(cuda_only):
        ap.error(f"fix {sorted(fixes & set(cuda_only))} needs --device cuda")
    for alt in alternatives:
        if set(alt) <= fixes:
            ap.error(f"{' and '.join(sorted(alt))} are alternatives: pick one")
    return fixes
