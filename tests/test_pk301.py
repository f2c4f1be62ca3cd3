"""PK301 on a written-out attention: the glue a nanoGPT block makes under autocast (scale, mask,
casts around an fp32 softmax, dropout, a copy), a log-softmax that is a loss and not an attention,
and the shapes read from an op record's batched GEMMs when its attention list is empty."""
from __future__ import annotations

from profkit.judge.rules import pk301_attention_path as pk301
import shared


def test_the_warp_softmax_of_a_loss_is_a_log_softmax():
    log = ("void <unnamed>::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, (int)10, (bool)1, "
           "(bool)0>(T2 *, const T1 *, int, int, int, const bool *, int, bool)")
    plain = ("void <unnamed>::softmax_warp_forward<float, float, float, (int)11, (bool)0, (bool)0>"
             "(T2 *, const T1 *, int, int, int, const bool *, int, bool)")
    assert pk301.LOG_RE.search(log) and not pk301.LOG_RE.search(plain)


def test_attention_shapes_from_batched_gemm_pairs():
    gemms = [{"op": "bmm", "batch": 24, "m": 2048, "n": 2048, "k": 64, "count": 24},   # Q.K^T, dP
             {"op": "bmm", "batch": 24, "m": 2048, "n": 64, "k": 2048, "count": 36},   # P.V, dQ
             {"op": "bmm", "batch": 24, "m": 64, "n": 2048, "k": 2048, "count": 12},   # dK^T
             {"op": "addmm", "batch": 1, "m": 4096, "n": 2304, "k": 768, "count": 12},
             {"op": "bmm", "batch": 8, "m": 32, "n": 32, "k": 16, "count": 2}]         # too small
    assert pk301._gemm_pairs(gemms) == [{"batch": 24, "sq": 2048, "sk": 2048, "d": 64, "dv": 64,
                                        "mask": "none", "count": 24}]
    assert pk301._gemm_pairs(gemms[1:]) == []      # no scores GEMM: no attention


def test_a_nanogpt_attention_is_priced_as_flash_from_the_record_gemms():
    """handwritten_attention_train (12 layers, 2k tokens, bf16 autocast): eight kernels between
    each attention's GEMMs; its op record (taken before casts were followed to the softmax) holds
    no attention, only GEMMs. Measured by hand without a profiler: SDPA 2.12x."""
    p = shared.corpus("handwritten_attention_train")
    f = next(f for f in p.findings() if f.code == "PK301")
    ev = f.evidence
    assert ev["priced_from"] == "flash_estimate" and "batched GEMMs" in ev["shapes_from"]
    assert ev["attentions"] == 120                       # 12 forward and 12 backward an iteration, 5 iterations
    # (1.74x before the driver query in front of each removed launch went with its dispatch;
    # 1.90x on the 15-iteration window, 1.94x on 10, 1.97x on 6)
    assert round(f.expected_end_to_end_speedup, 2) == 1.97   # on the 5 iterations the committed capture keeps
