"""Fine-tuning a BERT-base-sized encoder for classification with layer-wise learning-rate decay
written as one optimizer parameter group per parameter, as fine-tuning notebooks often do: 12
``nn.TransformerEncoderLayer`` layers (hidden 768, 12 heads, GELU), word, position and type
embeddings (vocabulary 30,522), a 2-class head; 109M parameters in 151 groups (lr = 2e-5 x
0.9^(12 - layer), no weight decay on biases and norms), AdamW (PyTorch's default implementation,
foreach on CUDA), a linear warm-up and decay schedule (``LambdaLR``), bf16 autocast, batch 16 x 256
fresh random tokens.

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``, and
the scheduler's step after it).

Defect: the foreach implementation batches its kernels within a parameter group; with one
parameter per group, AdamW's step runs its Python and its dozen kernels 151 times, one small
tensor at a time (biases of 768 floats among them): ~1,800 launches and their host time each step
beside ~7 ms of forward and backward.

    python w_llrd_param_groups_finetune.py [--steps 40] [--fix grouped|fused_adamw|grouped_fused]

Fixes:
  grouped        the same learning rates and decay in one group per (layer, decay or not): 28
                 groups, foreach kept.
  fused_adamw    ``AdamW(fused=True)`` with the 151 groups kept: one kernel a group.
  grouped_fused  both.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, nvtx, program_args, run, train_step  # noqa: E402

FIXES = ("grouped", "fused_adamw", "grouped_fused")
CUDA_ONLY: tuple[str, ...] = ()
ALTERNATIVES = (("grouped", "fused_adamw", "grouped_fused"),)


class Encoder(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int, classes: int) -> None:
        super().__init__()
        self.word, self.position, self.token_type = nn.Embedding(vocab, d), nn.Embedding(seq, d), nn.Embedding(2, d)
        self.ln = nn.LayerNorm(d)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, activation="gelu",
                                                               batch_first=True) for _ in range(layers))
        self.head = nn.Linear(d, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.ln(self.word(ids) + self.position(pos) + self.token_type(torch.zeros_like(ids)))
        for layer in self.layers:
            x = layer(x)
        return self.head(x[:, 0])


def layer_of(name: str, layers: int) -> int:
    """The depth of a parameter for the decay: embeddings 0, encoder layer i at i + 1, the head
    above the last layer."""
    if name.startswith("layers."):
        return int(name.split(".")[1]) + 1
    return layers + 1 if name.startswith("head.") else 0


def param_groups(model: Encoder, layers: int, lr: float, decay: float, per_parameter: bool) -> list[dict]:
    """Layer-wise decayed learning rates, no weight decay on biases and norms: a group per
    parameter, or one per (depth, decay or not) holding the same settings."""
    groups: dict[tuple, dict] = {}
    out = []
    for name, p in model.named_parameters():
        depth = layer_of(name, layers)
        wd = 0.0 if p.ndim == 1 else 0.01
        settings = {"lr": lr * decay ** (layers + 1 - depth), "weight_decay": wd}
        if per_parameter:
            out.append({"params": [p], **settings})
        else:
            groups.setdefault((depth, wd), {"params": [], **settings})["params"].append(p)
    return out if per_parameter else list(groups.values())


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model, optimizer and schedule with ``fixes`` applied; returns one training step (fresh
    token ids and labels; the step's loss)."""
    vocab, d, heads, layers, seq, batch, classes = 30522, 768, 12, 12, 256, 16, 2
    if args.small:
        vocab, d, heads, layers, seq, batch, classes = 100, 32, 4, 2, 16, 2, 2
    torch.manual_seed(0)
    model = Encoder(vocab, d, heads, layers, seq, classes).to(dev).train()
    grouped = "grouped" in fixes or "grouped_fused" in fixes
    fused = "fused_adamw" in fixes or "grouped_fused" in fixes
    opt = torch.optim.AdamW(param_groups(model, layers, 2e-5, 0.9, per_parameter=not grouped),
                            fused=True if fused else None)
    total, warm = 10_000, 500
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warm, (total - s) / (total - warm)))
    amp = bf16_autocast(dev)

    def forward() -> torch.Tensor:
        ids = torch.randint(0, vocab, (batch, seq), device=dev)
        labels = torch.randint(0, classes, (batch,), device=dev)
        return F.cross_entropy(model(ids), labels)

    def schedule(loss: torch.Tensor) -> None:
        with nvtx("scheduler"):
            sched.step()
    return lambda: train_step(forward, opt, amp, after=schedule)


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, ALTERNATIVES, steps=40)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_llrd_param_groups_finetune: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()
