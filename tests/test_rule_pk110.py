"""PK110 request-at-a-time on the committed captures: a service that runs 32 waiting requests
through its model one at a time (request_loop_infer) against the host loops it must leave alone
(decode steps, per-image post-processing, rollouts, evaluation reads)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import shared
from profkit.judge.rules import pk110_request_at_a_time as pk110

ROOT = Path(__file__).resolve().parents[1]


def test_pk110_batches_the_requests_of_a_service_loop():
    """request_loop_infer: 32 texts of 8-256 tokens a batch, each copied in, run through a 6-layer
    encoder at batch 1 (80.9 kernels on average; cuBLAS picks other kernels for some lengths, so no exact
    repeat: PK107 finds none) and read back with int(). Batched by hand it measured 24.0x
    (2.45 ms against 58.8 ms) after warm-up; the capture's iterations still compile cuDNN
    attention for each new length (18 module loads an iteration, PK108's), which the other
    requests' calls take with them: 18.2x on the capture's calibration."""
    p = shared.corpus("request_loop_infer")
    f = next(f for f in p.findings() if f.code == "PK110")
    ev = f.evidence
    assert (ev["requests"], ev["common_kernels"], ev["loops_per_iteration"]) == (32, 74, 1.0)
    assert ev["kernels_per_request"] == 80.9
    assert round(f.expected_end_to_end_speedup, 2) == 18.19
    assert f.action.startswith("a loop runs the model on one input at a time: 32 requests in a row")
    assert p.run_json()["actions"][0]["code"] == "PK110"
    assert "PK107" not in [f.code for f in p.findings()]


@pytest.mark.parametrize("name", ["detection_postproc_infer", "kv_decode_sampling", "eval_metrics_host",
                                  "rl_rollout_train", "early_exit_sync", "per_sample_loss_train", "bert_b1_infer"])
def test_pk110_leaves_other_host_loops_alone(name):
    # per-image NMS and decode steps read values back but take no new input from the host per
    # copy; a rollout feeds observations in and reads actions back but its segments are a few
    # small MLP kernels under min_kernels; the others read back nothing per copy
    assert "PK110" not in [f.code for f in shared.corpus(name).findings()]


def test_segments_match_by_the_kernels_they_share():
    a, b = Counter({1: 10, 2: 5}), Counter({1: 10, 2: 4, 3: 1})
    assert pk110._overlap(a, b) == 14 / 15 and pk110._overlap(a, Counter()) == 0.0
    assert pk110.RULE.param("min_overlap") == 0.8 and pk110.RULE.param("min_requests") == 8
