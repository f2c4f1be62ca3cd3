"""PK305 on 16-bit convolutions in NCHW: channels_last alone, priced by cuDNN's transposes going
(a lower bound: PyTorch's NCHW BatchNorm and pooling kernels keep their time); not offered where
the network also runs attention (the layout change adds copies at its boundaries)."""
from __future__ import annotations

from pathlib import Path

import profkit

CORPUS = Path(__file__).resolve().parents[1] / "traces" / "corpus"


def test_bf16_convolutions_on_nchw_tensors_are_offered_channels_last():
    # per-image augmentation and a bf16 CNN in NCHW (an H100): channels_last measured 1.15x
    (f,) = [f for f in profkit.load(CORPUS / "gpu_augment_loop_train.sqlite.xz").findings() if f.code == "PK305"]
    assert f.action.startswith("convolutions in 16-bit on NCHW tensors")
    assert f.evidence["transpose_ns"] == 9_227_730 and f.evidence["precision"] == "16-bit"
    assert round(f.expected_end_to_end_speedup, 3) == 1.076 == f.evidence["channels_last_speedup"]
    assert "a lower bound" in f.basis and f.switch == "channels_last"


def test_not_offered_beside_attention():
    # an fp16 diffusion UNet whose attention is written out (bmm, softmax): channels_last 0.90x
    found = profkit.load(CORPUS / "unet_diffusion_sample.sqlite.xz").findings()
    assert "PK305" not in [f.code for f in found]
