"""Fine-tuning a text classifier with autograd's anomaly detection left on: a 6-layer encoder of
hidden 512 (8 heads, FFN 2048; the BERT-shaped encoder of w_padded_encoder_infer.py), random
weights, batch 32 of 128 tokens, 3 classes, the forward under ``torch.autocast(bfloat16)``,
AdamW (PyTorch's default: foreach on CUDA). Fresh random token ids and labels made on the GPU
each step; no read of the loss inside the step.

Each step is an NVTX range ``train_step`` holding ``forward``, ``backward`` and ``optimizer``.

Defect: the forward and backward run inside ``torch.autograd.detect_anomaly()``, a debugging
block that was never taken out. In that mode autograd keeps the Python stack of every node
it creates in the forward (a traceback taken per operation), and the backward checks every
node's gradients for NaN as it makes them: ``isnan(grad).any()`` read back on the host, a wait
for the GPU after each backward node, a few hundred a step.

    python w_anomaly_debug_train.py [--steps 40] [--fix anomaly_off | --fix check_nan_off]
                                    [--fix fused_adamw]

Fixes:
  anomaly_off    no anomaly detection (the block taken out).
  check_nan_off  ``detect_anomaly(check_nan=False)``: the stacks are still kept, the backward's
                 NaN checks and their waits go.
  fused_adamw    ``AdamW(fused=True)``.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)
from w_padded_encoder_infer import Encoder  # noqa: E402 (BERT's encoder, written once)

FIXES = ("anomaly_off", "check_nan_off", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()


def anomaly(fixes: set[str]) -> Callable[[], contextlib.AbstractContextManager]:
    """The debugging block around the step's forward and backward, as ``fixes`` leave it."""
    if "anomaly_off" in fixes:
        return contextlib.nullcontext
    check_nan = "check_nan_off" not in fixes
    return lambda: torch.autograd.detect_anomaly(check_nan=check_nan)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and optimizer with ``fixes`` applied; returns one training step (fresh tokens
    and labels; its loss, kept on the GPU)."""
    vocab, d, heads, layers, ffn, seq, batch, classes = 30522, 512, 8, 6, 2048, 128, 32, 3
    if args.small:
        vocab, d, heads, layers, ffn, seq, batch, classes = 500, 32, 4, 2, 64, 16, 4, 3
    torch.manual_seed(0)
    model = Encoder(vocab, d, heads, layers, ffn, seq, classes).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01,
                            fused=True if "fused_adamw" in fixes else None)
    amp = bf16_autocast(dev)
    block = anomaly(fixes)
    mask = torch.ones(batch, seq, dtype=torch.long, device=dev)

    def step() -> torch.Tensor:
        ids = torch.randint(1000 % vocab, vocab, (batch, seq), device=dev)
        labels = torch.randint(0, classes, (batch,), device=dev)
        with block():
            return train_step(lambda: F.cross_entropy(model(ids, mask).float(), labels), opt, amp).detach()
    return step


def main() -> None:
    # detect_anomaly warns each time it is entered that it slows the program: once is enough here
    warnings.filterwarnings("once", message="Anomaly Detection has been enabled")
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, alternatives=[("anomaly_off", "check_nan_off")],
                                    small_help="tiny encoder, short texts and small batches, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_anomaly_debug_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()
