"""Object-detection inference with the post-processing on the host, written as many detection
repositories write it: a YOLO-style anchor-free detector (hand-written conv-BN-SiLU backbone
with residual stages, detection heads at strides 8, 16 and 32, 20 classes), random weights,
fp32, batch 8 of 640 x 640 images (8,400 candidate boxes an image), then per image in a Python
loop: best class per box, score threshold by a boolean mask, ``torchvision.ops.nms`` class by
class, and ``.tolist()`` of the kept boxes for the JSON result.

Random weights give no meaningful scores, so the heads' biases are centred on a first batch
(``centre_heads``: every class among the candidates) and the score threshold is set once, so
that about 3% of the candidate boxes pass: ~250 an image over ~20 classes, as a trained detector
on busy scenes passes. Every variant is built from the same seed.

Each batch is an NVTX range ``infer`` holding ``forward`` (backbone, heads and the box decode)
and ``postprocess`` (threshold, NMS, the copy of the results to Python lists).

Defect: the post-processing is launched and waited for one image and one class at a time. Every
boolean-mask index, ``unique()``, each ``nms`` (which reads its suppression mask back to the
host) and the final ``.tolist()`` wait for the GPU: some 20 classes x 8 images x a handful of
syncs a batch, each around a few tiny kernels, with the GPU idle in between.

    python w_detection_postproc_infer.py [--steps 30] [--fix batched_nms]
        [--fix bf16_channels_last] [--fix graph]

Fixes:
  batched_nms         the whole batch post-processed at once on the GPU: one threshold mask over
                      all images, one ``torchvision.ops.batched_nms`` with image x class as the
                      group index, the kept rows sorted by image and score on the GPU, then one
                      copy to the host, split per image there.
  bf16_channels_last  backbone and heads in bf16 and channels_last (the input converted on the
                      GPU); the decoded boxes and scores cast back to fp32 for the post-processing.
                      Speeds up the convolutions only, which are not where the time goes.
  graph               the forward (backbone, heads, decode) captured as a CUDA graph on a static
                      input buffer and replayed: saves its ~200 launches; the post-processing and
                      its syncs stay as they are.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torchvision

from _corpus import graphed, nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("batched_nms", "bf16_channels_last", "graph")
CUDA_ONLY = ("graph",)
IOU, MAX_DET, PASS_FRACTION = 0.45, 300, 0.03


def cbs(cin: int, cout: int, k: int = 3, s: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, bias=False), nn.BatchNorm2d(cout), nn.SiLU())


class Residual(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.body = nn.Sequential(cbs(c, c // 2, 1), cbs(c // 2, c, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def stage(cin: int, cout: int, blocks: int) -> nn.Sequential:
    return nn.Sequential(cbs(cin, cout, 3, 2), *[Residual(cout) for _ in range(blocks)])


class Detector(nn.Module):
    """Backbone to strides 8/16/32, a head per stride (box distances and class logits), and the
    decode of every grid cell into an (x1, y1, x2, y2) box and per-class scores."""

    def __init__(self, w: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(cbs(3, w, 3, 2), stage(w, 2 * w, 1))                # stride 4
        self.s8, self.s16, self.s32 = stage(2 * w, 4 * w, 3), stage(4 * w, 8 * w, 3), stage(8 * w, 16 * w, 1)
        self.heads = nn.ModuleList(nn.Sequential(cbs(c, 4 * w), cbs(4 * w, 4 * w), nn.Conv2d(4 * w, 4 + classes, 1))
                                   for c in (4 * w, 8 * w, 16 * w))
        for m in self.modules():  # Kaiming init keeps the random features' scale through the depth
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
        for h in self.heads:  # outputs of unit scale
            nn.init.normal_(h[-1].weight, std=h[-1].in_channels ** -0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p8 = self.s8(self.stem(x))
        p16 = self.s16(p8)
        p32 = self.s32(p16)
        boxes, scores = [], []
        for feat, head, stride in zip((p8, p16, p32), self.heads, (8, 16, 32)):
            out = head(feat)
            b, _, h, w = out.shape
            ys, xs = torch.meshgrid(torch.arange(h, device=x.device), torch.arange(w, device=x.device),
                                    indexing="ij")
            centre = (torch.stack((xs, ys), -1).reshape(1, h * w, 2) + 0.5) * stride
            out = out.flatten(2).transpose(1, 2).float()  # [B, h*w, 4 + classes]
            dist = out[..., :4].exp().clamp(max=50.0) * stride
            boxes.append(torch.cat((centre - dist[..., :2], centre + dist[..., 2:]), -1))
            scores.append(out[..., 4:].sigmoid())
        return torch.cat(boxes, 1), torch.cat(scores, 1)


@torch.no_grad()
def centre_heads(model: Detector, images: torch.Tensor) -> None:
    """Random features share one direction, so one class would win at every box: the heads' biases
    are set from a first batch so that their outputs are centred (box sizes a few strides, every
    class among the candidates), as a trained head's are."""
    means = {}
    hooks = [h[-1].register_forward_hook(lambda m, inp, out, i=i: means.__setitem__(i, inp[0].mean((0, 2, 3))))
             for i, h in enumerate(model.heads)]
    model(images)
    for hook in hooks:
        hook.remove()
    for i, h in enumerate(model.heads):
        conv = h[-1]
        conv.bias.copy_(-conv.weight[:, :, 0, 0] @ means[i])
        conv.bias[4:] -= 4.6  # the usual prior: class scores start near 1%


def postprocess_loop(boxes: torch.Tensor, scores: torch.Tensor, thresh: float) -> list[list[list[float]]]:
    """Per image, per class: the host waits at each mask, ``unique``, NMS and ``tolist``."""
    results = []
    for b, s in zip(boxes, scores):
        conf, label = s.max(1)
        keep = conf > thresh
        b, conf, label = b[keep], conf[keep], label[keep]
        dets = []
        for c in label.unique().tolist():
            m = label == c
            bc, sc = b[m], conf[m]
            kept = torchvision.ops.nms(bc, sc, IOU)
            dets.append(torch.cat((bc[kept], sc[kept, None], torch.full_like(sc[kept, None], c)), 1))
        det = torch.cat(dets) if dets else b.new_zeros(0, 6)
        det = det[det[:, 4].argsort(descending=True)[:MAX_DET]]
        results.append(det.tolist())
    return results


def postprocess_batched(boxes: torch.Tensor, scores: torch.Tensor, thresh: float) -> list[list[list[float]]]:
    """The batch at once: one mask, one batched NMS over image x class, one copy to the host."""
    n, a, classes = scores.shape
    conf, label = scores.max(2)
    image = torch.arange(n, device=boxes.device)[:, None].expand(n, a)
    keep = conf > thresh
    b, conf, label, image = boxes[keep], conf[keep], label[keep], image[keep]
    kept = torchvision.ops.batched_nms(b, conf, image * classes + label, IOU)  # sorted by score
    kept = kept[torch.sort(image[kept], stable=True)[1]]  # by image, by score within an image
    det = torch.cat((b[kept], conf[kept, None], label[kept, None].float(), image[kept, None].float()), 1)
    rows = det.tolist()  # the one device-to-host copy
    results: list[list[list[float]]] = [[] for _ in range(n)]
    for r in rows:
        if len(results[int(r[6])]) < MAX_DET:
            results[int(r[6])].append(r[:6])
    return results


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], list]:
    """The detector with ``fixes`` applied and its threshold; returns one batch's step (fresh
    images, the annotated forward and post-processing; the detections per image)."""
    width, classes, batch, size = (48, 20, 8, 640) if not args.small else (8, 20, 2, 128)
    torch.manual_seed(0)  # every variant the same weights: the post-processing's work depends on them
    model = Detector(width, classes).to(dev).eval()
    centre_heads(model, torch.rand(batch, 3, size, size, device=dev))
    dtype, fmt = torch.float32, torch.contiguous_format
    if "bf16_channels_last" in fixes:
        dtype, fmt = torch.bfloat16, torch.channels_last
        model = model.to(dtype, memory_format=fmt)
    forward = model
    if "graph" in fixes:
        forward = graphed(lambda x: model(x), torch.zeros(batch, 3, size, size, device=dev, dtype=dtype)
                          .contiguous(memory_format=fmt))
    post = postprocess_batched if "batched_nms" in fixes else postprocess_loop
    with torch.no_grad():
        _, s = model(torch.rand(batch, 3, size, size, device=dev).to(dtype, memory_format=fmt))
        thresh = torch.quantile(s.amax(2).flatten().float(), 1 - PASS_FRACTION).item()

    @torch.no_grad()
    def step() -> list:
        images = torch.rand(batch, 3, size, size, device=dev)  # a decoded, resized, normalised batch
        with nvtx("infer"):
            with nvtx("forward"):
                boxes, scores = forward(images.to(dtype, memory_format=fmt))
            with nvtx("postprocess"):
                return post(boxes, scores, thresh)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    steps_help="batches (the first ones are warm-up)")
    ran = run(build, args, fixes, dev)
    if ran:
        dets = ran[1][-1]
        print(f"w_detection_postproc_infer: {args.steps} batches, fixes {sorted(fixes) or 'none'}, "
              f"{sum(map(len, dets))} detections in the last batch of {len(dets)}")


if __name__ == "__main__":
    main()
