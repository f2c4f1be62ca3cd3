"""The verdict read from the profiled timeline, and what the calibrated step model says of the
program without the profiler where the two disagree."""
from __future__ import annotations

from pathlib import Path

import shared

CORPUS = Path(__file__).resolve().parents[1] / "traces" / "corpus"


def test_a_compiled_step_waited_for_the_traced_host_only():
    # compiled_step_train: under nsys the GPU idles 23% waiting for the host; without it (24.1 ms
    # an iteration timed by hand) the GPU's work is all of the critical path, and CUDA graphs
    # measured 1.03x (its capture cut to 10 iterations, then 7: 97% and 36% over the 14 it held)
    v = shared.profile(CORPUS / "compiled_step_train.sqlite.xz").run_json()["verdict"]
    assert v["class"] == "host-bound" and v["without_profiler"] == "gpu-bound"
    assert v["reason"].endswith("without the profiler the GPU sets the pace (100% of the unprofiled step's "
                                "critical path is GPU work): under it the host ran 34% slower and the "
                                "GPU waited for it")


def test_a_host_bound_step_stays_host_bound():
    # item_loss_small_train: host-bound with and without the profiler (its graphs measured 3.54x)
    v = shared.profile(CORPUS / "item_loss_small_train.sqlite.xz").run_json()["verdict"]
    assert v["class"] == "host-bound" and "without_profiler" not in v
