"""The Triton backend's fixed launch rules (CPU: no kernel runs)."""
from __future__ import annotations

import pytest

pytest.importorskip("triton", reason='the Triton backend tests need triton: pip install -e ".[kernels,test]"')

from kernels import triton_kernels as tk  # noqa: E402

CONFIGS = tk._row_configs()


def _warps(named_args, **kwargs):
    return [c.num_warps for c in tk._prune_by_rule(CONFIGS, named_args, **kwargs)]


@pytest.mark.skipif(len(CONFIGS) == 1, reason="the interpreter has a single config")
def test_prune_rules():
    # decode rows: Liger-style warps by row length, never timed
    assert _warps({"ROWS_CLASS": 0}, BLOCK=4096) == [8]
    assert _warps({"ROWS_CLASS": 0}, BLOCK=8192) == [16]
    # add+RMSNorm's reload mode: block // 256 warps (measured best at 4096 and 8192)
    assert _warps({"ROWS_CLASS": 1}, BLOCK=4096, RELOAD=True) == [16]
    assert _warps({"ROWS_CLASS": 1}, BLOCK=8192, RELOAD=True) == [32]
    assert _warps({"ROWS_CLASS": 1}, BLOCK=1024, RELOAD=True) == [4]
    # other prefill rows: every candidate is timed
    assert _warps({"ROWS_CLASS": 1}, BLOCK=4096, RELOAD=False) == [4, 8, 16, 32]
    assert _warps({"ROWS_CLASS": 1}, BLOCK=4096) == [4, 8, 16, 32]


def test_reload_warps_bounds():
    assert [tk._reload_warps(b) for b in (256, 2048, 4096, 8192, 16384)] == [4, 8, 16, 32, 32]
