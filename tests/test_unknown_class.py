"""An op whose bound is unknown flows through every consumer: table, report, plots, diff."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

import profkit  # noqa: E402
from profkit.compare import diff as pdiff  # noqa: E402
from profkit.show import render  # noqa: E402
from profkit.show import report
from profkit.show.plots import roofline, timeline  # noqa: E402
from synth import TID, make_trace  # noqa: E402

CUDNN = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7"


@pytest.fixture
def trace(tmp_path):
    kernels, runtime, nvtx = [], [], []
    t = 1_000_000
    for i in range(5):
        for nid, text in ((1, "attn"), (2, "add")):
            runtime.append((t - 5000, t - 4000, i * 2 + nid))
            nvtx.append((t - 6000, t - 3000, text, TID))
            kernels.append((t, t + 500_000, i * 2 + nid, nid))
            t += 600_000
    return make_trace(tmp_path / "u.sqlite", kernels=kernels, runtime=runtime, nvtx=nvtx,
                      strings={1: CUDNN, 2: "void at::native::vectorized_elementwise_kernel<"
                               "(int)8, at::native::CUDAFunctor_add<c10::BFloat16>>(int)",
                               9: "cudaLaunchKernel"})


def test_unknown_reaches_every_consumer(trace, tmp_path):
    prof = profkit.load(trace)
    df = prof.ops(by="range")
    assert df.loc["attn", "class"] == "unknown" and df.loc["attn", "rung"] == "none"
    assert "measure before acting" in df.loc["attn", "action"]
    header = {"trace": str(trace), "gpu": "H200", "total_gpu_time_ns": 1, "level": "range",
              "peaks_source": "spec"}
    assert "unknown" in render.table(df, header)
    assert render.evidence_text(df.loc["attn"])
    for fmt in ("html", "markdown"):
        out = report.build(prof, tmp_path / f"r_{fmt}", fmt=fmt)
        assert "unknown" in out.read_text()
    timeline(prof, by="range")
    roofline(prof, by="range")
    res = pdiff.diff(prof, profkit.load(trace), by="range")
    assert pdiff.to_markdown(res)
