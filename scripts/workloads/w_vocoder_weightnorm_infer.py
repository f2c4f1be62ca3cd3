"""A neural vocoder's generator run for inference with its weight normalisation left on, as
HiFi-GAN-style code trained with ``torch.nn.utils.parametrizations.weight_norm`` and then loaded
for synthesis does: 80-band mel spectrograms (batch 4, 128 frames) upsampled 256x to audio by
four transposed 1-D convolutions (8, 8, 2, 2), each followed by three residual blocks of dilated
1-D convolutions (kernels 3, 7, 11; dilations 1, 3, 5), 256 channels at the start, halved at each
upsampling; fp32, weights random.

Each call is one batch of mel frames to audio: an NVTX range ``infer``.

Defect: every convolution's weight is a parametrization recomputed at every call from its
direction and its gain (``torch._weight_norm``: a norm over the weight and the scaling, one
fused kernel on CUDA, and the parametrization's Python around it, for each of the 42
convolutions), although the weights never change at inference.

    python w_vocoder_weightnorm_infer.py [--steps 40] [--fix fold_weight_norm] [--fix tf32]
                                         [--fix compile]

Fixes:
  fold_weight_norm  the parametrizations removed once at load, leaving the weights they compute
                    (``parametrize.remove_parametrizations(m, "weight")``): plain convolutions.
  tf32              TF32 convolutions (``torch.backends.cudnn.allow_tf32`` is on by default:
                    ``torch.set_float32_matmul_precision("high")`` changes the GEMMs only; here
                    nothing, a control).
  compile           the generator under ``torch.compile`` (the parametrizations traced with it).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm

from _corpus import nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("fold_weight_norm", "tf32", "compile")
CUDA_ONLY: tuple[str, ...] = ()
SLOPE = 0.1


class ResBlock(nn.Module):
    """Three dilated convolutions, each with a residual (HiFi-GAN's ResBlock2 shape)."""

    def __init__(self, ch: int, k: int, dilations=(1, 3, 5)) -> None:
        super().__init__()
        self.convs = nn.ModuleList(weight_norm(nn.Conv1d(ch, ch, k, dilation=d, padding=d * (k - 1) // 2))
                                   for d in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c in self.convs:
            x = x + c(F.leaky_relu(x, SLOPE))
        return x


class Generator(nn.Module):
    def __init__(self, mels: int = 80, ch: int = 256, ups=(8, 8, 2, 2), kernels=(3, 7, 11)) -> None:
        super().__init__()
        self.pre = weight_norm(nn.Conv1d(mels, ch, 7, padding=3))
        self.ups, self.blocks = nn.ModuleList(), nn.ModuleList()
        for u in ups:
            self.ups.append(weight_norm(nn.ConvTranspose1d(ch, ch // 2, 2 * u, stride=u, padding=u // 2)))
            ch //= 2
            self.blocks.append(nn.ModuleList(ResBlock(ch, k) for k in kernels))
        self.post = weight_norm(nn.Conv1d(ch, 1, 7, padding=3))

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = self.pre(mel)
        for up, blocks in zip(self.ups, self.blocks):
            x = up(F.leaky_relu(x, SLOPE))
            x = sum(b(x) for b in blocks) / len(blocks)
        return torch.tanh(self.post(F.leaky_relu(x)))


def fold(model: nn.Module) -> None:
    """Each weight-normalised convolution's weight computed once and kept as a plain parameter."""
    for m in model.modules():
        if parametrize.is_parametrized(m, "weight"):
            parametrize.remove_parametrizations(m, "weight", leave_parametrized=True)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The generator with ``fixes`` applied; returns one call (the batch's audio)."""
    batch, frames, ch = 4, 128, 256
    if args.small:
        batch, frames, ch = 1, 4, 32
    torch.manual_seed(0)
    model = Generator(ch=ch).to(dev).eval()
    if "fold_weight_norm" in fixes:
        fold(model)
    fwd = torch.compile(model) if "compile" in fixes else model
    gen = torch.Generator(device=dev).manual_seed(1)
    mels = [torch.randn(batch, 80, frames, device=dev, generator=gen) for _ in range(4)]
    state = {"i": 0}

    @torch.inference_mode()
    def step() -> torch.Tensor:
        with nvtx("infer"):
            mel = mels[state["i"] % len(mels)]
            state["i"] += 1
            return fwd(mel)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=40)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_vocoder_weightnorm_infer: {args.steps} calls, fixes {sorted(fixes) or 'none'}, "
              f"last mean |audio| {ran[1][-1].abs().mean().item():.4f}")


if __name__ == "__main__":
    main()
