"""Inference with autograd left on: the op record saw inputs requiring gradients in an iteration
that ran no backward and stepped no optimizer (encoder_grad_on_infer, an nn.TransformerEncoder
called without torch.no_grad(): its SDPA calls took inputs that require gradients). classify
says so beside the actions, unpriced, and ``--try auto`` runs ``inference_mode`` to measure it
(torch.inference_mode() measured 1.30x on that program: the encoder's fast path skips the
padding)."""
from __future__ import annotations

from pathlib import Path

import pytest

import profkit
from profkit.judge.trials import auto_trials
from profkit.run.replacements import Replacements

ROOT = Path(__file__).resolve().parents[1]
ENCODER = ROOT / "traces" / "corpus" / "encoder_grad_on_infer.sqlite.xz"


def test_the_committed_encoder_capture_is_inference_with_autograd_on():
    prof = profkit.load(ENCODER)
    run = prof.run_json()
    assert run["autograd_at_inference"] == {"ops": 6}
    assert not prof.backward_kernels()
    r = prof.run()
    assert "inference_mode" in auto_trials(prof.findings(), prof, r)


@pytest.mark.parametrize("name", ["real/train_llama", "corpus/bert_fp32_infer", "corpus/mae_pretrain_train"])
def test_training_and_inference_without_gradients_are_not(name):
    # training runs a backward; the BERT inference runs under no_grad (its SDPA takes no
    # gradient-requiring inputs)
    assert "autograd_at_inference" not in profkit.load(ROOT / f"traces/{name}.sqlite.xz").run_json()


def _rec(**record) -> Replacements:
    return Replacements(record={"sdpa": [{"grad": True, "count": 6}], **record})


@pytest.mark.parametrize("record,backward_kernels,want", [
    ({}, False, 6),                                   # an old record: the trace has no backward kernels
    ({}, True, None),                                 # ... and one whose trace has them
    ({"backward": False}, True, 6),                   # a new record says no backward ran
    ({"backward": True}, False, None),
    ({"optimizer": [{"class": "AdamW"}]}, False, None),  # an optimizer stepped: training
])
def test_what_the_record_and_the_trace_say(record, backward_kernels, want):
    assert _rec(**record).autograd_at_inference(lambda: backward_kernels) == want
    assert Replacements(record={"sdpa": [{"grad": False, "count": 6}]}).autograd_at_inference(lambda: False) is None
