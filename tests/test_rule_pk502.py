"""PK502 accumulation-allreduce on hand-built DDP steps (no committed trace accumulates gradients
over micro-batches under DDP): it fires on 4 all-reduce rounds an optimizer step with the price
computed by hand, and stays quiet with one round, on the 2-GPU DDP traces and on the committed
single-GPU traces."""
from __future__ import annotations

from pathlib import Path

import pytest

import profkit
import shared

ROOT = Path(__file__).resolve().parents[1]
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)"
US = 1_000


def ddp_trace(path: Path, micro: int, iterations: int = 8) -> Path:
    """A GPU-paced DDP step of ``micro`` micro-batches, each: forward (400 us) on the compute stream
    7, backward in two halves (400 us each), the first half's bucket all-reduced (400 us, NCCL
    stream 17) beside the second half, the second bucket (300 us) after both, with nothing
    beside it: the next forward (and the optimizer, 200 us) waits for it. Per micro-batch 1.5 ms, so an
    iteration takes micro x 1.5 + 0.2 ms. The CPU launches a kernel every 10 us from the start, far
    ahead of the GPU: the GPU sets the pace."""
    from synth import TID, make_trace
    strings = {1: "fwd_kernel", 2: "bwd_kernel", 3: ALLREDUCE, 4: "optimizer_kernel", 9: "cudaLaunchKernel"}
    kernels, runtime, nvtx = [], [], []
    corr = 0
    t = 1_000 * US
    cpu = [500 * US]

    def k(start, dur, name, stream=7):
        nonlocal corr
        corr += 1
        runtime.append((cpu[0], cpu[0] + 5 * US, corr, TID))
        cpu[0] += 10 * US
        kernels.append((start, start + dur, corr, name, 0, stream))

    for _ in range(iterations):
        t0, c0 = t, cpu[0]
        for _m in range(micro):
            k(t, 400 * US, 1)                       # forward
            k(t + 402 * US, 400 * US, 2)            # backward, first half
            k(t + 804 * US, 400 * US, 3, 17)        # bucket 1, beside the second half
            k(t + 804 * US, 400 * US, 2)            # backward, second half
            k(t + 1_206 * US, 300 * US, 3, 17)      # bucket 2, exposed
            t += 1_510 * US                         # the next forward waits for it (4 us later)
        k(t, 200 * US, 4)                           # the optimizer
        t += 202 * US
        nvtx.append((c0, cpu[0], "train_step", TID))
    return make_trace(path, kernels=kernels, runtime=runtime, nvtx=nvtx, strings=strings)


def test_four_rounds_a_step_are_told_no_sync_at_the_hand_computed_price(tmp_path):
    p = profkit.load(ddp_trace(tmp_path / "accum.sqlite", micro=4))
    f = next(f for f in p.findings() if f.code == "PK502")
    assert "no_sync" in f.action and "first 3 of the 4 micro-batches" in f.action
    assert f.evidence["rounds"] == 4 and f.evidence["allreduces_per_round"] == 2
    # By hand: an iteration is 4 x 1.51 + 0.202 = 6.242 ms; without the first three rounds'
    # all-reduces the first three micro-batches no longer wait for their exposed bucket:
    # 3 x (1.51 - 0.304) + 1.51 + 0.202 = 5.33 ms: 1.171x (the CPU is far ahead: it never sets
    # the pace)
    assert f.expected_end_to_end_speedup == pytest.approx(6.242 / 5.330, rel=0.002)
    assert f.expected_end_to_end_speedup <= f.bound
    # the kernels it speaks for: the all-reduces, 4x fewer of them
    assert f.kernels == frozenset({ALLREDUCE}) and f.expected_op_speedup == pytest.approx(4.0)


def test_one_round_a_step_is_quiet(tmp_path):
    p = profkit.load(ddp_trace(tmp_path / "one.sqlite", micro=1))
    assert "PK502" not in {f.code for f in p.findings()}


def test_quiet_on_the_ddp_traces_without_accumulation():
    for r in (0, 1):
        assert "PK502" not in {f.code for f in shared.profile(ROOT / f"traces/ddp2/rank{r}.sqlite.xz").findings()}
    assert "PK502" not in {f.code for f in shared.profile(ROOT / "traces/ddp2_nosync/rank0.sqlite.xz").findings()}
