"""PK108 on a capture cut short while every step still compiled: the trace may hold only the
program's first pass over its shapes."""
from __future__ import annotations

from pathlib import Path

import shared

CORPUS = Path(__file__).resolve().parents[1] / "traces" / "corpus"


def test_a_capture_cut_while_every_step_compiled_says_so():
    # kv_decode_sampling: 20 captured tokens, each compiling a cuDNN attention for its new length
    (f,) = [f for f in shared.profile(CORPUS / "kv_decode_sampling.sqlite.xz").findings() if f.code == "PK108"]
    assert f.evidence["capture_cut_while_compiling"] is True
    assert f.action.endswith("the capture stopped after 20 iterations, every one compiling: if the program's "
                             "shapes come back later (batches of the same lengths), only its first pass pays "
                             "this and its steady step is not in this trace: capture more iterations "
                             "(--max-iterations) to see it")
