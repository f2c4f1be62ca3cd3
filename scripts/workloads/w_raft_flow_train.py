"""Optical-flow training in RAFT's style (Teed and Deng, 2020), written as its reference code is: a
feature encoder (a 7 x 7 convolution at stride 2, then residual blocks of 64, 96 and 128 channels
at 1/2, 1/4 and 1/8 resolution, instance norm, a 1 x 1 convolution to 256) over both frames, a
context encoder of the same shape (batch norm) over the first; the all-pairs correlation of the
two frames' 1/8-resolution features (one ``bmm``: 1280 x 1280 a pair at 256 x 320) average-pooled
into a 4-level pyramid, in float32 outside autocast as RAFT keeps it; 12 refinement iterations,
each looking up the pyramid around the current flow with ``F.grid_sample`` (9 x 9 points a
level), encoding the lookup and the flow with convolutions, updating a 128-channel ConvGRU and
adding its head's delta to the flow; each iteration's flow upsampled 8 x bilinearly and scored by
an L1 loss against the target flow, weighted 0.8^(12 - i). Batch 4 of random 256 x 320 frame
pairs and random smooth target flows, AdamW (lr 4e-4, weight decay 1e-4), fp32 NCHW (cuDNN's
convolutions in TF32, its default).

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect (if any): the 12 iterations run about a hundred small kernels each forward and twice that
backward, over 4 x 32 x 40 positions (a few microseconds of GPU each): ~4,000 launches a step,
beside about 1.3 TFLOP of convolutions, most of them the update block's at 1/8 resolution.

    python w_raft_flow_train.py [--steps 30] [--fix fewer_iters] [--fix bf16 | --fix channels_last_bf16]
        [--fix compile]

Fixes:
  fewer_iters         8 refinement iterations instead of 12 (a change of the recipe: fewer
                      refinements of the flow in training).
  bf16                bf16 autocast over the forward and the loss (the correlation and its
                      lookup stay float32, as RAFT's mixed precision leaves them).
  channels_last_bf16  model and frames in ``torch.channels_last`` and bf16 autocast.
  compile             ``torch.compile(model)`` (default mode; Dynamo unrolls the iterations).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("fewer_iters", "bf16", "channels_last_bf16", "compile")
CUDA_ONLY: tuple[str, ...] = ()
LEVELS, RADIUS, GAMMA = 4, 4, 0.8


def corr_pyramid(f1: torch.Tensor, f2: torch.Tensor, levels: int = LEVELS) -> list[torch.Tensor]:
    """The all-pairs correlation of ``f1`` and ``f2`` (B x D x H x W): [B*H*W, 1, H, W] (each
    pixel of frame 1 against every pixel of frame 2, over sqrt(D)), then average-pooled by 2 at
    each further level."""
    b, d, h, w = f1.shape
    corr = torch.bmm(f1.reshape(b, d, h * w).transpose(1, 2), f2.reshape(b, d, h * w)) / d ** 0.5
    out = [corr.reshape(b * h * w, 1, h, w)]
    for _ in range(levels - 1):
        out.append(F.avg_pool2d(out[-1], 2, stride=2))
    return out


def lookup(pyramid: list[torch.Tensor], coords: torch.Tensor, radius: int = RADIUS) -> torch.Tensor:
    """Each level bilinearly sampled on a (2r+1)^2 window (rows dy, columns dx) around
    ``coords`` / 2^level (B x 2 x H x W, x then y, in 1/8-resolution pixels; zeros outside):
    B x levels*(2r+1)^2 x H x W."""
    b, _, h, w = coords.shape
    d = torch.linspace(-radius, radius, 2 * radius + 1, device=coords.device)
    dy, dx = torch.meshgrid(d, d, indexing="ij")
    delta = torch.stack([dx, dy], -1).view(1, 2 * radius + 1, 2 * radius + 1, 2)
    centre = coords.permute(0, 2, 3, 1).reshape(b * h * w, 1, 1, 2)
    out = []
    for i, corr in enumerate(pyramid):
        pts = centre / 2 ** i + delta
        hl, wl = corr.shape[-2:]
        # grid_sample's [-1, 1] with align_corners=True: -1 and 1 at the first and last pixels' centres
        x, y = pts.split(1, dim=-1)
        grid = torch.cat([2 * x / (wl - 1) - 1, 2 * y / (hl - 1) - 1], dim=-1)
        out.append(F.grid_sample(corr, grid, align_corners=True).view(b, h, w, -1))
    return torch.cat(out, dim=-1).permute(0, 3, 1, 2)


def norm(kind: str, c: int) -> nn.Module:
    return nn.InstanceNorm2d(c) if kind == "instance" else nn.BatchNorm2d(c)


class Residual(nn.Module):
    def __init__(self, cin: int, cout: int, kind: str, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
        self.n1, self.n2 = norm(kind, cout), norm(kind, cout)
        self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride), norm(kind, cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.n1(self.conv1(x)))
        return F.relu(self.down(x) + self.n2(self.conv2(y)))


class Encoder(nn.Module):
    """RAFT's BasicEncoder: 1/8 resolution, ``out`` channels."""

    def __init__(self, width: int, out: int, kind: str) -> None:
        super().__init__()
        w1, w2, w3 = width, width * 3 // 2, width * 2
        self.stem = nn.Sequential(nn.Conv2d(3, w1, 7, 2, 3), norm(kind, w1), nn.ReLU())
        self.layers = nn.Sequential(Residual(w1, w1, kind, 1), Residual(w1, w1, kind, 1),
                                    Residual(w1, w2, kind, 2), Residual(w2, w2, kind, 1),
                                    Residual(w2, w3, kind, 2), Residual(w3, w3, kind, 1))
        self.out = nn.Conv2d(w3, out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.layers(self.stem(x)))


class ConvGRU(nn.Module):
    def __init__(self, hidden: int, inp: int) -> None:
        super().__init__()
        self.convz, self.convr, self.convq = (nn.Conv2d(hidden + inp, hidden, 3, padding=1) for _ in range(3))

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        hx = torch.cat([h, x], dim=1)
        z, r = torch.sigmoid(self.convz(hx)), torch.sigmoid(self.convr(hx))
        q = torch.tanh(self.convq(torch.cat([r * h, x], dim=1)))
        return (1 - z) * h + z * q


class Update(nn.Module):
    """RAFT's BasicUpdateBlock (its widths at hidden 128): motion encoder, ConvGRU, flow head."""

    def __init__(self, hidden: int, ctx: int, planes: int) -> None:
        super().__init__()
        self.convc1 = nn.Conv2d(planes, 2 * hidden, 1)
        self.convc2 = nn.Conv2d(2 * hidden, 3 * hidden // 2, 3, padding=1)
        self.convf1, self.convf2 = nn.Conv2d(2, hidden, 7, padding=3), nn.Conv2d(hidden, hidden // 2, 3, padding=1)
        self.conv = nn.Conv2d(2 * hidden, hidden - 2, 3, padding=1)
        self.gru = ConvGRU(hidden, hidden + ctx)
        self.head = nn.Sequential(nn.Conv2d(hidden, 2 * hidden, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(2 * hidden, 2, 3, padding=1))

    def forward(self, net, inp, corr, flow):
        c = F.relu(self.convc2(F.relu(self.convc1(corr))))
        f = F.relu(self.convf2(F.relu(self.convf1(flow))))
        motion = torch.cat([F.relu(self.conv(torch.cat([c, f], dim=1))), flow], dim=1)
        net = self.gru(net, torch.cat([inp, motion], dim=1))
        return net, self.head(net)


class RAFT(nn.Module):
    def __init__(self, width: int = 64, feat: int = 256, hidden: int = 128) -> None:
        super().__init__()
        self.hidden = hidden
        self.fnet = Encoder(width, feat, "instance")
        self.cnet = Encoder(width, 2 * hidden, "batch")
        self.update = Update(hidden, hidden, LEVELS * (2 * RADIUS + 1) ** 2)

    def forward(self, im1: torch.Tensor, im2: torch.Tensor, iters: int) -> list[torch.Tensor]:
        """The flow (B x 2 x H x W, pixels) after each iteration."""
        f1, f2 = self.fnet(torch.cat([im1, im2])).float().chunk(2)
        with torch.autocast(im1.device.type, enabled=False):
            pyramid = corr_pyramid(f1, f2)
        net, inp = self.cnet(im1).split([self.hidden, self.hidden], dim=1)
        net, inp = torch.tanh(net), F.relu(inp)
        b, _, h, w = f1.shape
        ys, xs = torch.meshgrid(torch.arange(h, device=im1.device), torch.arange(w, device=im1.device), indexing="ij")
        coords0 = torch.stack([xs, ys]).float()[None].expand(b, 2, h, w)
        coords1, flows = coords0, []
        for _ in range(iters):
            coords1 = coords1.detach()   # RAFT's: no gradient through the lookup's positions
            with torch.autocast(im1.device.type, enabled=False):
                corr = lookup(pyramid, coords1)
            net, delta = self.update(net, inp, corr, coords1 - coords0)
            coords1 = coords1 + delta
            flows.append(8 * F.interpolate(coords1 - coords0, scale_factor=8, mode="bilinear", align_corners=True))
        return flows


def sequence_loss(flows: list[torch.Tensor], target: torch.Tensor, gamma: float = GAMMA) -> torch.Tensor:
    """RAFT's: the L1 error of each iteration's flow, the later ones weighted more."""
    n = len(flows)
    return sum(gamma ** (n - i - 1) * (f.float() - target).abs().mean() for i, f in enumerate(flows))


def random_batch(batch: int, h: int, w: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two frames in [-1, 1] and a smooth target flow (a coarse random field upsampled, up to a
    few tens of pixels), drawn on ``dev``."""
    im1 = torch.rand(batch, 3, h, w, device=dev) * 2 - 1
    im2 = torch.rand(batch, 3, h, w, device=dev) * 2 - 1
    coarse = 8 * torch.randn(batch, 2, h // 32, w // 32, device=dev)
    return im1, im2, F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=True)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and AdamW with ``fixes`` applied; returns one training step (fresh frames and
    flows; its loss). The step's ``predict(im1, im2)`` is the variant's forward alone."""
    batch, h, w, width, feat, hidden = (2, 128, 128, 8, 16, 8) if args.small else (4, 256, 320, 64, 256, 128)
    iters = 8 if "fewer_iters" in fixes else 12
    fmt = torch.channels_last if "channels_last_bf16" in fixes else torch.contiguous_format
    torch.manual_seed(0)
    model = RAFT(width, feat, hidden).to(dev, memory_format=fmt).train()
    opt = torch.optim.AdamW(model.parameters(), lr=4e-4, weight_decay=1e-4)
    fwd = torch.compile(model) if "compile" in fixes else model
    amp = bf16_autocast(dev, bool(fixes & {"bf16", "channels_last_bf16"}))

    def predict(im1: torch.Tensor, im2: torch.Tensor) -> list[torch.Tensor]:
        with amp():
            return fwd(im1.contiguous(memory_format=fmt), im2.contiguous(memory_format=fmt), iters)

    def step() -> torch.Tensor:
        im1, im2, target = random_batch(batch, h, w, dev)
        im1, im2 = im1.contiguous(memory_format=fmt), im2.contiguous(memory_format=fmt)
        return train_step(lambda: sequence_loss(fwd(im1, im2, iters), target), opt, amp)
    step.predict, step.model, step.opt = predict, model, opt
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    alternatives=[("bf16", "channels_last_bf16")],
                                    small_help="tiny frames and widths, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_raft_flow_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()
