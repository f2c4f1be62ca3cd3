"""Sliding-window segmentation of 3-D volumes, as medical-imaging inference code does it: a
volume of 160^3 voxels (a CT scan's intensities, fp32) held on the host as a numpy array, a
small 3-D UNet (three levels of 16, 32 and 64 channels, instance norm, LeakyReLU, four classes;
fp32, ``torch.inference_mode()``) run on windows of 96^3 with a quarter's overlap or more (8 windows),
one at a time. Per window, as a hand-written loop does: the window copied out of the volume and
to the GPU, the network run, its logits copied back to host memory, and weighted by a Gaussian
importance map into numpy accumulators of the volume's logits and weights; at the end the
volume's labels are the argmax over classes on the host.

Each iteration segments one volume (four volumes, taken in turn) in an NVTX range ``infer``
holding one ``window`` range per window.

Defect: each window's 14 MB of logits cross to pageable host memory and are added into a 66 MB
numpy accumulator by one CPU thread, and the argmax over 4.1M voxels x 4 classes runs on the
host: the CPU's copies and numpy passes take longer than the GPU's network, which waits for
them, 8 times a volume.

    python w_sliding_window_infer.py [--steps 30] [--fix gpu_accumulate] [--fix batched] [--fix bf16]

Fixes:
  gpu_accumulate  the volume copied to the GPU once, the windows cut and their weighted logits
                  accumulated there, the argmax on the GPU: only the uint8 labels come back.
  batched         four windows a forward (a window batch of 4), the accumulation on the host kept.
  bf16            the network in bf16 autocast.
"""
from __future__ import annotations

import itertools
from typing import Callable

import numpy as np
import torch
import torch.nn as nn

from _corpus import bf16_autocast, nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("gpu_accumulate", "batched", "bf16")
CUDA_ONLY: tuple[str, ...] = ()
WINDOW_BATCH = 4


def block(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv3d(cin, cout, 3, stride, 1), nn.InstanceNorm3d(cout, affine=True), nn.LeakyReLU(0.01),
                         nn.Conv3d(cout, cout, 3, 1, 1), nn.InstanceNorm3d(cout, affine=True), nn.LeakyReLU(0.01))


class UNet3d(nn.Module):
    def __init__(self, ch: tuple[int, int, int], classes: int) -> None:
        super().__init__()
        a, b, c = ch
        self.enc0, self.enc1, self.enc2 = block(1, a), block(a, b, 2), block(b, c, 2)
        self.up1, self.dec1 = nn.ConvTranspose3d(c, b, 2, 2), block(2 * b, b)
        self.up0, self.dec0 = nn.ConvTranspose3d(b, a, 2, 2), block(2 * a, a)
        self.head = nn.Conv3d(a, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e0 = self.enc0(x)
        e1 = self.enc1(e0)
        d1 = self.dec1(torch.cat([self.up1(self.enc2(e1)), e1], 1))
        return self.head(self.dec0(torch.cat([self.up0(d1), e0], 1)))


def starts(size: int, window: int, overlap: float) -> list[int]:
    """The windows' first voxels along one axis: steps of ``window * (1 - overlap)``, the last
    window flush with the end."""
    step = int(window * (1 - overlap))
    out = list(range(0, size - window + 1, step))
    return out if out[-1] == size - window else out + [size - window]


def gaussian(window: int, dev: torch.device) -> torch.Tensor:
    """The importance map: a Gaussian of sigma window/8 about the window's centre, so that a voxel
    seen by several windows is weighted toward the ones it is central in."""
    r = torch.arange(window, dtype=torch.float32) - (window - 1) / 2
    g = torch.exp(-(r / (window / 8)) ** 2 / 2)
    return (g[:, None, None] * g[None, :, None] * g[None, None, :]).clamp_min(1e-3).to(dev)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], np.ndarray]:
    """The network and the volumes; returns one iteration (one volume's labels, on the host)."""
    size, window, ch, classes, n_vol = 160, 96, (16, 32, 64), 4, 4
    if args.small:
        size, window, ch, classes, n_vol = 24, 16, (4, 8, 8), 3, 2
    torch.manual_seed(0)
    net = UNet3d(ch, classes).to(dev).eval()
    amp = bf16_autocast(dev, "bf16" in fixes)
    rng = np.random.default_rng(0)
    volumes = [rng.standard_normal((size, size, size), dtype=np.float32) for _ in range(n_vol)]
    at = starts(size, window, 0.25)
    windows = list(itertools.product(at, at, at))
    per = WINDOW_BATCH if "batched" in fixes else 1
    groups = [windows[i:i + per] for i in range(0, len(windows), per)]
    weight = gaussian(window, dev)
    weight_host = weight.cpu().numpy()
    turn = itertools.cycle(volumes)

    def net_on(x: torch.Tensor) -> torch.Tensor:
        with amp():
            return net(x).float()

    def on_host(vol: np.ndarray) -> np.ndarray:
        logits = np.zeros((classes, size, size, size), np.float32)
        weights = np.zeros((size, size, size), np.float32)
        for group in groups:
            with nvtx("window"):
                crops = np.stack([vol[z:z + window, y:y + window, x:x + window] for z, y, x in group])
                out = net_on(torch.from_numpy(crops)[:, None].to(dev)).cpu().numpy()
                for (z, y, x), o in zip(group, out):
                    sl = (slice(z, z + window), slice(y, y + window), slice(x, x + window))
                    logits[(slice(None), *sl)] += o * weight_host
                    weights[sl] += weight_host
        return (logits / weights).argmax(0).astype(np.uint8)

    def on_gpu(vol: np.ndarray) -> np.ndarray:
        v = torch.from_numpy(vol).to(dev)
        logits = torch.zeros(classes, size, size, size, device=dev)
        weights = torch.zeros(size, size, size, device=dev)
        for group in groups:
            with nvtx("window"):
                crops = torch.stack([v[z:z + window, y:y + window, x:x + window] for z, y, x in group])
                out = net_on(crops[:, None])
                for (z, y, x), o in zip(group, out):
                    sl = (slice(z, z + window), slice(y, y + window), slice(x, x + window))
                    logits[(slice(None), *sl)] += o * weight
                    weights[sl] += weight
        return (logits / weights).argmax(0).to(torch.uint8).cpu().numpy()

    segment = on_gpu if "gpu_accumulate" in fixes else on_host

    def step() -> np.ndarray:
        vol = next(turn)
        with nvtx("infer"), torch.inference_mode():
            return segment(vol)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    steps_help="volumes segmented (the first ones are warm-up)",
                                    small_help="tiny volumes, windows and network, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        counts = np.bincount(ran[1][-1].ravel(), minlength=4).tolist()
        print(f"w_sliding_window_infer: {args.steps} volumes, fixes {sorted(fixes) or 'none'}, "
              f"last labels by class {counts}")


if __name__ == "__main__":
    main()
