"""PK108 on a capture cut short while every step still compiled: the trace may hold only the
program's first pass over its shapes, and nothing is promised."""
from __future__ import annotations

from pathlib import Path

import pytest
import shared

CORPUS = Path(__file__).resolve().parents[1] / "traces" / "corpus"


@pytest.mark.parametrize("name,n,most", [("kv_decode_sampling", 20, 4.257), ("beam_search_decode", 30, 8.291)])
def test_a_capture_cut_while_every_step_compiled_promises_nothing(name, n, most):
    # kv_decode_sampling: 20 captured tokens, each compiling a cuDNN attention for its new length
    # (its steady token measured 9 ms against 81); beam_search_decode: 30 tokens of its first
    # 48-token search (1.7 ms a token after it, 33 ms in it), where every fix measured under 1.05x
    prof = shared.profile(CORPUS / f"{name}.sqlite.xz")
    (f,) = [f for f in prof.findings() if f.code == "PK108"]
    assert f.evidence["capture_cut_while_compiling"] is True
    assert f.expected_end_to_end_speedup == 1.0 and f.bound == pytest.approx(most, abs=1e-3)
    assert f.basis.startswith(f"not promised: the capture stopped after {n} iterations, nearly every one "
                              "compiling, so its steady step is not in this trace; if the program's shapes "
                              f"never come back, {most:.2f}x (step model: ")
    assert f.action.endswith(f"the capture stopped after {n} iterations, every one compiling: if the program's "
                             "shapes come back later (batches of the same lengths), only its first pass pays "
                             "this and its steady step is not in this trace: capture it again with more "
                             "iterations (--max-iterations; profkit capture does this itself when it sees "
                             "such a run)")
    assert "code-load-per-step" not in [a.rule for a in prof.run().top_actions()]
