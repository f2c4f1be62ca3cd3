"""Evaluation loop of a ViT-B/16 classifier over ImageNet-21k's 21,843 classes (plain PyTorch:
a patch convolution and ``nn.TransformerEncoder``, 12 layers, hidden 768, random weights), bf16
autocast, batch 128 of 224 x 224 images and their labels (fresh random tensors on the GPU).

Per batch the loop copies the full logits to the host (``logits.float().cpu().numpy()``, 11 MB
into pageable memory) with the labels, and computes its metrics with numpy and scikit-learn, as
evaluation scripts commonly do: top-1 (``argmax``) and top-5 (``np.argpartition``) hits, the
batch's ``sklearn.metrics.accuracy_score`` for the log, predictions and labels kept for the
macro F1 (``sklearn.metrics.f1_score``) computed once at the end.

Each batch is an NVTX range ``eval_batch`` holding ``forward``, ``to_host`` and ``metrics``.

Defect: the copy waits for the forward, and the host's work on 2.8M scores a batch (a partial
sort for the top 5 among them) runs while the GPU idles; the next batch's forward starts only
after it. GPU and CPU take turns.

    python w_eval_metrics_host.py [--steps 60] [--fix argmax_gpu] [--fix pinned] | [--fix metrics_gpu]

Fixes:
  argmax_gpu   the top 5 taken on the GPU (``logits.topk(5)``): only [128, 5] ids and the labels
               are copied back, the hits counted on them in numpy as before.
  pinned       what is copied (the logits, or the ids with ``argmax_gpu``) goes into one of two
               page-locked buffers with ``non_blocking=True`` and an event recorded; the host
               computes a batch's metrics one batch later, after queuing the next forward, so
               its numpy work overlaps the GPU's.
  metrics_gpu  nothing copied per batch: top-1 and top-5 hits and per-class true positives,
               predicted and true counts accumulated on the GPU (``index_add_``); the F1 and
               accuracies read once at the end.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn as nn
from sklearn.metrics import accuracy_score, f1_score

from _corpus import bf16_autocast, nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("argmax_gpu", "pinned", "metrics_gpu")
CUDA_ONLY = ("pinned",)


class ViT(nn.Module):
    def __init__(self, img: int, patch: int, d: int, depth: int, heads: int, classes: int) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, (img // patch) ** 2 + 1, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.encoder(x))[:, 0])


class HostMetrics:
    """Top-1/top-5 hits counted in numpy from the logits (or top-5 ids), predictions and labels
    kept for sklearn's macro F1."""

    def __init__(self) -> None:
        self.hit1 = self.hit5 = self.n = 0
        self.preds: list[np.ndarray] = []
        self.labels: list[np.ndarray] = []
        self.batch_acc: list[float] = []

    def update(self, out: np.ndarray, labels: np.ndarray, ids_only: bool) -> None:
        if ids_only:  # [B, 5] ids, best first
            pred, top5 = out[:, 0], out
        else:         # [B, classes] scores
            pred, top5 = out.argmax(1), np.argpartition(out, -5, axis=1)[:, -5:]
        self.hit1 += int((pred == labels).sum())
        self.hit5 += int((top5 == labels[:, None]).any(1).sum())
        self.n += len(labels)
        self.batch_acc.append(accuracy_score(labels, pred))
        self.preds.append(pred.copy())
        self.labels.append(labels.copy())

    def result(self) -> tuple[float, float, float]:
        f1 = f1_score(np.concatenate(self.labels), np.concatenate(self.preds), average="macro")
        return self.hit1 / self.n, self.hit5 / self.n, float(f1)


class GpuMetrics:
    """The same counts accumulated on the GPU (``metrics_gpu``), read once by ``result``."""

    def __init__(self, classes: int, dev: torch.device) -> None:
        self.hits = torch.zeros(2, dtype=torch.long, device=dev)
        self.tp, self.npred, self.ntrue = (torch.zeros(classes, dtype=torch.long, device=dev) for _ in range(3))
        self.n = 0

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        top5 = logits.topk(5, dim=1).indices
        pred, ok = top5[:, 0], top5[:, 0] == labels
        self.hits += torch.stack([ok.sum(), (top5 == labels[:, None]).any(1).sum()])
        self.tp.index_add_(0, labels, ok.long())
        self.npred.index_add_(0, pred, torch.ones_like(pred))
        self.ntrue.index_add_(0, labels, torch.ones_like(labels))
        self.n += len(labels)

    def result(self) -> tuple[float, float, float]:
        present = (self.npred + self.ntrue) > 0  # sklearn's labels: those in y_true or y_pred
        f1 = (2 * self.tp / (self.npred + self.ntrue).clamp(min=1))[present].mean()
        hit1, hit5 = self.hits.tolist()
        return hit1 / self.n, hit5 / self.n, f1.item()


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], None]:
    """The model and metric state with ``fixes`` applied; returns one evaluation batch's step.
    ``step.result()`` drains what is pending and returns (top-1, top-5, macro F1)."""
    img, patch, d, depth, heads, classes, batch = 224, 16, 768, 12, 12, 21843, 128
    if args.small:
        img, patch, d, depth, heads, classes, batch = 32, 8, 32, 2, 4, 50, 4
    model = ViT(img, patch, d, depth, heads, classes).to(dev).eval()
    amp = bf16_autocast(dev)
    ids_only, pinned = "argmax_gpu" in fixes, "pinned" in fixes
    metrics = GpuMetrics(classes, dev) if "metrics_gpu" in fixes else HostMetrics()
    if pinned:
        width = 5 if ids_only else classes
        bufs = [(torch.empty(batch, width, dtype=torch.long if ids_only else torch.float32).pin_memory(),
                 torch.empty(batch, dtype=torch.long).pin_memory(), torch.cuda.Event()) for _ in range(2)]
    pending: list[int] = []  # with pinned: the buffer whose batch awaits its metrics
    count = [0]

    def consume(i: int) -> None:
        out, lab, ev = bufs[i]
        ev.synchronize()
        metrics.update(out.numpy(), lab.numpy(), ids_only)

    @torch.no_grad()
    def step() -> None:
        x = torch.randn(batch, 3, img, img, device=dev)
        y = torch.randint(0, classes, (batch,), device=dev)
        with nvtx("eval_batch"):
            with nvtx("forward"), amp():
                logits = model(x)
            if isinstance(metrics, GpuMetrics):
                with nvtx("metrics"):
                    metrics.update(logits, y)
                return
            with nvtx("to_host"):
                out = logits.topk(5, dim=1).indices if ids_only else logits.float()
                if pinned:
                    i = count[0] % 2
                    bufs[i][0].copy_(out, non_blocking=True)
                    bufs[i][1].copy_(y, non_blocking=True)
                    bufs[i][2].record()
                else:
                    out_np, y_np = out.cpu().numpy(), y.cpu().numpy()
            with nvtx("metrics"):
                if pinned:
                    if pending:
                        consume(pending.pop())
                    pending.append(i)
                    count[0] += 1
                else:
                    metrics.update(out_np, y_np, ids_only)

    def result() -> tuple[float, float, float]:
        while pending:
            consume(pending.pop())
        return metrics.result()
    step.result = result
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=60,
                                    alternatives=[("metrics_gpu", "argmax_gpu"), ("metrics_gpu", "pinned")],
                                    steps_help="batches (the first ones are warm-up)")
    ran = run(build, args, fixes, dev)
    if ran:
        top1, top5, f1 = ran[0].result()
        print(f"w_eval_metrics_host: {args.steps} batches, fixes {sorted(fixes) or 'none'}, "
              f"top-1 {top1:.4f}, top-5 {top5:.4f}, macro F1 {f1:.4f}")


if __name__ == "__main__":
    main()
