"""Image-classifier training step with gradient accumulation, already in bf16 and channels_last:
a ResNet-50-shaped network written in plain PyTorch (a 7 x 7 stem, four stages of bottleneck
blocks 3-4-6-3, widths 256-2048, BatchNorm and ReLU, random weights), 1,000 classes, 4
micro-batches of 32 images of 160 x 160 per optimizer step (an effective batch of 128), each
micro-batch's forward under ``torch.autocast(bfloat16)`` on channels_last tensors and
``(loss / 4).backward()``; then SGD with momentum and weight decay, ``fused=True``. Fresh random
images and labels every micro-batch; no read of the loss inside the step.

Each optimizer step is an NVTX range ``train_step`` holding, per micro-batch, ``forward`` and
``backward``, then ``optimizer``.

Defect: the micro-batch (32 images) was chosen for a smaller GPU; on an H100 or H200 each of
its forwards and backwards launches some thousand kernels, many of which fill a fraction of the
SMs, four times a step. BatchNorm's statistics are per micro-batch either way (a larger
micro-batch changes them, as it would on any GPU).

    python w_accum_resnet_train.py [--steps 20] [--fix bigger_micro | --fix one_batch]
                                   [--fix compile | --fix graph]

Fixes:
  bigger_micro  2 micro-batches of 64 images instead of 4 of 32: the same 128 images a step.
  one_batch     1 batch of 128 images, no accumulation.
  compile       ``torch.compile(model)`` (default mode), the 4 micro-batches kept.
  graph         the whole step (4 micro-batches and the optimizer) captured by hand in one CUDA graph
                (``torch.cuda.graph``, static input buffers filled by the graph's own RNG) and
                replayed. ``torch.compile(model, mode="reduce-overhead")`` is not an option here:
                its CUDA graph trees hand the backward's gradient buffers to ``.grad`` and overwrite
                them in the next micro-batch's backward ("accessing tensor output of CUDAGraphs that
                has been overwritten by a subsequent run", PyTorch issue 169545).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import capture_training, nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("bigger_micro", "one_batch", "compile", "graph")
CUDA_ONLY: tuple[str, ...] = ("graph",)
EFFECTIVE = 128  # images per optimizer step, whatever the micro-batches


class Bottleneck(nn.Module):
    def __init__(self, cin: int, mid: int, stride: int) -> None:
        super().__init__()
        cout = 4 * mid
        self.c1, self.b1 = nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.c2, self.b2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid)
        self.c3, self.b3 = nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(y)))
        return F.relu(self.b3(self.c3(y)) + self.down(x))


class ResNet(nn.Module):
    def __init__(self, blocks: tuple[int, ...], width: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], width
        for i, n in enumerate(blocks):
            mid = width * 2 ** i
            for j in range(n):
                layers.append(Bottleneck(cin, mid, 2 if j == 0 and i > 0 else 1))
                cin = 4 * mid
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], float]:
    """The model and optimizer with ``fixes`` applied; returns one optimizer step (accumulated over
    the micro-batches; the step's loss, kept on the GPU)."""
    accum = 1 if "one_batch" in fixes else 2 if "bigger_micro" in fixes else 4
    blocks, width, size, classes, effective = (3, 4, 6, 3), 64, 160, 1000, EFFECTIVE
    if args.small:
        blocks, width, size, classes, effective = (1, 1), 8, 32, 10, 8
    micro = effective // accum
    torch.manual_seed(0)
    model = ResNet(blocks, width, classes).to(dev).to(memory_format=torch.channels_last).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5,
                          fused=dev.type == "cuda")
    net = torch.compile(model) if "compile" in fixes else model

    def body() -> torch.Tensor:
        total = torch.zeros((), device=dev)
        for _ in range(accum):
            x = torch.randn(micro, 3, size, size, device=dev).contiguous(memory_format=torch.channels_last)
            y = torch.randint(0, classes, (micro,), device=dev)
            with nvtx("forward"), torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = F.cross_entropy(net(x), y) / accum
            with nvtx("backward"):
                loss.backward()
            total += loss.detach()
        with nvtx("optimizer"):
            opt.step()
            if "graph" not in fixes:  # a captured step's first backward writes the grads afresh
                opt.zero_grad(set_to_none=True)
        return total

    if "graph" in fixes:
        graph, s_total = capture_training(body, opt)

        def step() -> torch.Tensor:
            with nvtx("train_step"):
                graph.replay()
            return s_total
    else:
        def step() -> torch.Tensor:
            with nvtx("train_step"):
                return body()
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=20,
                                    steps_help="optimizer steps (the first ones are warm-up)",
                                    alternatives=[("bigger_micro", "one_batch"), ("compile", "graph")])
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_accum_resnet_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {float(ran[1][-1]):.3f}")


if __name__ == "__main__":
    main()
