"""Evidence selection: ncu per kernel identity, per-op dtypes, no reading above a roof, and the
classifier rules that real ops broke (flash attention with a memset, zero-FLOP copies)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from profkit.judge import evidence as ev
from profkit.judge.classify import classify_op, judge, launch_stats
from profkit.judge.dtypes import op_dtype
from profkit.model import BoundClass, Source
from profkit.read.peaks import Peaks

PEAKS = Peaks(gpu="test", memory_bandwidth=4.0e12,
              flops={"fp32": 5.0e13, "tf32": 4.0e14, "bf16": 8.0e14, "fp16": 7.7e14},
              launch_floor_ns=1000.0)
PID = 1 << 24


def acts(rows):
    """rows: (name, kind, start, end[, bytes])"""
    out = []
    for r in rows:
        name, kind, start, end = r[:4]
        out.append({"name": name, "kind": kind, "start": start, "end": end, "deviceId": 0,
                    "globalPid": PID, "bytes": r[4] if len(r) > 4 else None, "graphNodeId": None})
    return pd.DataFrame(out)


def ncu_rows(rows):
    """rows: (kernel_start, gpu_time_ns, dram_bytes, flops_fp32, flops_tensor)"""
    cols = {"globalPid": [], "deviceId": [], "kernel_start": [], "gpu_time_ns": [],
            "dram_bytes_read": [], "dram_bytes_write": [], "flops_fp64": [], "flops_fp32": [],
            "flops_fp16": [], "flops_tensor": [], "tensor_precision": [],
            "dram_throughput_pct": [], "sm_throughput_pct": [], "l2_bytes": []}
    for start, t, dram, f32, ften in rows:
        for k, v in (("globalPid", PID), ("deviceId", 0), ("kernel_start", start), ("gpu_time_ns", t),
                     ("dram_bytes_read", dram / 2), ("dram_bytes_write", dram / 2),
                     ("flops_fp64", 0.0), ("flops_fp32", f32), ("flops_fp16", 0.0),
                     ("flops_tensor", ften), ("tensor_precision", "bf16" if ften else None),
                     ("dram_throughput_pct", 50.0), ("sm_throughput_pct", 60.0), ("l2_bytes", None)):
            cols[k].append(v)
    return pd.DataFrame(cols)


def op_row(name="op", count=1, busy=1000.0, kpc=1.0, kmed=1000.0, frac=1.0):
    return {"name": name, "count": count, "busy_median_ns": busy, "gpu_time_median_ns": busy / frac,
            "kernels_per_call": kpc, "kernel_median_ns": kmed, "busy_fraction": frac}


def test_ncu_per_kernel_identity_and_copies_left_out():
    # one op: 4 fills (1 profiled) and 2 GEMMs (1 profiled), plus a host-to-device copy
    a = acts([("fill", "kernel", 0, 100), ("fill", "kernel", 200, 300), ("fill", "kernel", 400, 500),
              ("fill", "kernel", 600, 700), ("gemm", "kernel", 1000, 11000),
              ("gemm", "kernel", 20000, 30000),
              ("[CUDA memcpy Host-to-Device]", "memcpy", 40000, 2_000_000, 1e9)])
    n = ncu_rows([(0, 200.0, 1e6, 0.0, 0.0), (1000, 20000.0, 1e7, 0.0, 1e12)])
    w = ev.from_ncu(a, n, calls=1)
    # each profiled kernel stands for its own name's launches: 4 fills + 2 GEMMs
    assert w.bytes == pytest.approx(4 * 1e6 + 2 * 1e7)
    assert w.flops == pytest.approx(2 * 1e12)
    # ncu's own time (not nsys's, and the 2 ms copy is not in it)
    assert w.time_ns == pytest.approx(4 * 200 + 2 * 20000)
    assert w.precision == "bf16"


def test_zero_flops_is_never_compute():
    a = acts([("copy_kernel", "kernel", 0, 10000)])
    n = ncu_rows([(0, 10000.0, 0.0, 0.0, 0.0)])   # SM% 60 > DRAM% 50, no bytes, no FLOPs
    w = ev.from_ncu(a, n, calls=1)
    v = classify_op(op_row(busy=10000, kmed=10000), w, PEAKS, ["copy_kernel"])
    assert v.bound is BoundClass.MEMORY


def test_flash_attention_with_a_tiny_memset_is_not_launch_bound():
    a = acts([("[CUDA memset]", "memset", 0, 700, 64), ("flash_fwd_kernel", "kernel", 800, 1_770_800)] * 1)
    op = op_row(busy=1_770_700, kpc=2, kmed=(700 + 1_770_000) / 2, frac=0.999)
    op.update(launch_stats(a, PEAKS.launch_floor_ns))
    assert op["tiny_kernel_busy_share"] == 0.0
    v = classify_op(op, None, PEAKS, ["flash_fwd_kernel"])
    assert v.bound is not BoundClass.LAUNCH
    # a chain of tiny kernels still is
    tiny = acts([(f"k{i}", "kernel", i * 2000, i * 2000 + 900) for i in range(10)])
    op2 = op_row(busy=9000, kpc=10, kmed=900, frac=0.45)
    op2["busy_fraction"] = 0.9
    op2.update(launch_stats(tiny, PEAKS.launch_floor_ns))
    assert classify_op(op2, None, PEAKS, ["k0"]).bound is BoundClass.LAUNCH


def test_timeline_gemm_tiles_and_unknown():
    op = op_row(busy=60000, kmed=60000)
    assert classify_op(op, None, PEAKS, ["nvjet_sm90_tst_128x8_64x12_2x1_v_bz_NNT"]).bound \
        is BoundClass.MEMORY
    assert classify_op(op, None, PEAKS, ["nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"]).bound \
        is BoundClass.COMPUTE
    v = classify_op(op, None, PEAKS, ["cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16"])
    assert v.bound is BoundClass.UNKNOWN and v.confidence == "low"


def test_unknown_element_type_gives_both_bounds_and_low_confidence():
    w = ev.from_shapes("aten::add [[1024, 1024], [1024, 1024], []]", op_dtype(["triton_poi_fused_add_0"]))
    assert w.precision is None and w.confidence_cap == "low"
    assert w.bytes == 3 * 2**20 * 2
    assert w.notes["bytes_per_call_at_4B"] == 3 * 2**20 * 4
    v = classify_op(op_row(busy=10000, kmed=10000), w, PEAKS, ["triton_poi_fused_add_0"])
    assert v.confidence == "low" and v.evidence["precision"] == "unknown"


def test_known_element_type_from_the_op_kernels():
    w = ev.from_shapes("aten::mm [[4096, 4096], [4096, 4096]]",
                       op_dtype(["nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
                                 "void at::native::reduce_kernel<float>(float)"], [1e6, 1e7]))
    assert w.precision == "bf16" and w.bytes == 3 * 4096 * 4096 * 2


def test_reading_above_a_roof_falls_back_with_a_warning():
    # 1 GB "moved" in 10 us is 100 TB/s: impossible on a 4 TB/s part
    a = acts([("[CUDA memcpy Device-to-Device]", "memcpy", 0, 10000, 5e8)])
    op = op_row(busy=10000, kmed=10000)
    v, w = judge(op, [lambda: ev.from_copies(a, 1)], PEAKS, ["[CUDA memcpy Device-to-Device]"])
    assert w is None and v.source is Source.TIMELINE
    assert "impossible" in v.evidence["warnings"][0]
    assert v.pct_of_roof is None


def test_causal_attention_fallback():
    q = "[4, 16, 4096, 128]"
    key = f"aten::_scaled_dot_product_cudnn_attention [{q}, {q}, {q}]"
    w = ev.from_shapes(key, op_dtype(["void k<c10::BFloat16>(int)"]))
    full = w.flops
    # a time at which the full count is 125% of the bf16 roof, the causal one 62%
    t = full / (1.25 * PEAKS.flops["bf16"]) * 1e9
    v, used = judge(op_row(busy=t, kmed=t), [w], PEAKS, ["flash"])
    assert used is not None and used.flops == pytest.approx(full / 2)
    assert v.pct_of_roof <= 1.0 and "warnings" in v.evidence


def test_small_excess_over_a_measured_roof_is_clamped_not_dropped():
    w = ev.Work(Source.HINTS, flops=1.02 * PEAKS.flops["bf16"] * 1e-3, bytes=1e6, precision="bf16")
    v, used = judge(op_row(busy=1e6, kmed=1e6), [w], PEAKS, ["nvjet_sm90_tst_256x128_64x4"])
    assert used is w and v.pct_of_roof == 1.0 and v.evidence["pct_of_compute_roof"] == 1.0
    assert "noise" in v.evidence["warnings"][0]


FLASH = ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<(int)128, "
         "(int)128, (int)64, (int)4, (bool)0, (bool)0, cutlass::bfloat16_t, pytorch_flash::"
         "Flash_kernel_traits<(int)128, (int)128, (int)64, (int)4, cutlass::bfloat16_t>>, (bool)0, "
         "(bool){c}, (bool)0, (bool)0, (bool)1, (bool)1, (bool)0, (bool)0>(pytorch_flash::Flash_fwd_params)")


def test_causal_flag_from_flash_kernel_names():
    assert ev.attention_causal([FLASH.format(c=1)]) is True
    assert ev.attention_causal([FLASH.format(c=0)]) is False
    assert ev.attention_causal(["cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16"]) is None
    q = "[4, 16, 4096, 128]"
    key = f"aten::_scaled_dot_product_flash_attention [{q}, {q}, {q}]"
    d = op_dtype([FLASH.format(c=1)])
    assert d.precision == "bf16"
    full = ev.from_shapes(key, d, causal=False)
    half = ev.from_shapes(key, d, causal=True)
    assert half.flops * 2 == full.flops and half.fallback is None and half.notes["causal"] is True


def test_ncu_l2_resident_store_uses_l2_bytes():
    # a 16.8 MB store that stays in L2: DRAM saw 33 kB, L2 saw the whole store
    a = acts([("div_kernel", "kernel", 0, 10000)])
    n = ncu_rows([(0, 10000.0, 33e3, 4e6, 0.0)])
    n["l2_bytes"] = 2 * 16.8e6
    w = ev.from_ncu(a, n, calls=1)
    assert w.bytes_basis == "l2" and w.bytes == pytest.approx(33.6e6)
    assert w.notes["dram_bytes_per_call"] == pytest.approx(33e3)
    v = classify_op(op_row(busy=10000, kmed=10000), w, PEAKS, ["div_kernel"])
    assert v.bound is BoundClass.MEMORY and v.evidence["bytes_basis"] == "l2"


def test_ncu_hbm_bytes_are_cold_reads_plus_every_store():
    # a 16.8 MB fp32 store fed by 8.4 MB of reads: DRAM wrote 33 kB during the kernel (the rest
    # is written back after it ends); L2 took every store
    a = acts([("mul_kernel", "kernel", 0, 10000), ("mul_kernel", "kernel", 20000, 30000)])
    n = ncu_rows([(0, 10000.0, 2 * 33e3, 0.0, 0.0)])
    n["dram_bytes_read"] = 8.4e6
    n["l2_bytes"] = 60e6
    n["l2_write_bytes"] = 16.8e6
    w = ev.from_ncu(a, n, calls=2)
    assert w.bytes_basis == "hbm" and w.bytes == pytest.approx(8.4e6 + 16.8e6)
    assert w.notes["hbm_bytes_per_call"] == pytest.approx(8.4e6 + 16.8e6)
    assert w.notes["dram_bytes_per_call"] == pytest.approx(8.4e6 + 33e3)
    assert "DRAM reads + stores into L2" in w.detail
    # a store larger than L2 reaches DRAM during the kernel: the larger count wins
    n["l2_write_bytes"] = 1e3
    assert ev.from_ncu(a, n, calls=2).bytes == pytest.approx(8.4e6 + 33e3)
    # counters from an older capture (no L2 write sectors): the DRAM/L2 rule as before
    n["l2_write_bytes"] = np.nan
    assert ev.from_ncu(a, n, calls=2).bytes_basis in ("dram", "l2")


def test_l2_residency_uses_the_traces_own_l2_size():
    # 55 MB of L2 traffic in one launch: over H100's 50 MiB, under the H200's 60 MiB
    a = acts([("div_kernel", "kernel", 0, 10000)])
    n = ncu_rows([(0, 10000.0, 1e6, 4e6, 0.0)])
    n["l2_bytes"] = 55e6
    assert ev.from_ncu(a, n, calls=1).bytes_basis == "dram"
    assert ev.from_ncu(a, n, calls=1, l2_capacity=60 * 2**20).bytes_basis == "l2"


def test_cutlass_tiles_and_cudnn_helpers():
    op = op_row(busy=60000, kmed=60000)
    big = "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64_32x4_nhwc_align8>(T1::Params)"
    assert classify_op(op, None, PEAKS, [big]).bound is BoundClass.COMPUTE
    pad = ("void nhwcAddPaddingKernel<__nv_bfloat16, __nv_bfloat16, float, (bool)1, "
           "(cudnnKernelDataType_t)0>(int, int, const T1 *, T2 *)")
    assert classify_op(op, None, PEAKS, [pad]).bound is BoundClass.MEMORY
    assert classify_op(op, None, PEAKS, ["nvjet_sm90_tst_24x64_64x16_4x2_h_bz_bias_TNN"]).bound \
        is BoundClass.MEMORY
