"""DistilBERT fine-tuning step (HF DistilBertForSequenceClassification, random weights, 6 layers,
768 wide) in plain fp32, batch 32 x 256 tokens, AdamW with PyTorch's default implementation
(foreach on CUDA), and the running loss logged every step with ``loss.item()``, as most
fine-tuning loops written by hand do.

Each step is an NVTX range ``train_step`` holding ``forward``, ``backward``, ``optimizer`` and
``log``. A program the step model was not built on: captured and timed in one allocation after
the model's last change.

Defects: the GEMMs run in fp32 on the CUDA cores (TF32 off by default); ``.item()`` waits for
the step's GPU work every step (in a GPU-bound step it costs little: the queue refills while
the GPU runs the next forward's first kernels); AdamW's foreach passes over 67M parameters.

    python w_distilbert_finetune.py [--steps 40] [--fix tf32 | --fix bf16_autocast]
                                    [--fix fused_adamw] [--fix no_item]

Fixes:
  tf32           ``torch.set_float32_matmul_precision("high")``.
  bf16_autocast  forward and loss under ``torch.autocast(bfloat16)``.
  fused_adamw    ``AdamW(fused=True)``.
  no_item        the loss summed on the GPU and read once after the loop.
"""
from __future__ import annotations

import torch
from transformers import DistilBertConfig, DistilBertForSequenceClassification

from _corpus import bf16_autocast, LossLog, program_args, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("tf32", "bf16_autocast", "fused_adamw", "no_item")
CUDA_ONLY: tuple[str, ...] = ()


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY,
                                    alternatives=[("tf32", "bf16_autocast")])
    if args.small:
        cfg = DistilBertConfig(vocab_size=1000, max_position_embeddings=64, dim=64, hidden_dim=128,
                               n_layers=2, n_heads=2, num_labels=4)
        batch, seq = 2, 16
    else:
        cfg = DistilBertConfig(num_labels=4)  # 6 layers, 768 wide, 12 heads, vocabulary 30522
        batch, seq = 32, 256
    model = DistilBertForSequenceClassification(cfg).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True if "fused_adamw" in fixes else None)
    amp = bf16_autocast(dev, "bf16_autocast" in fixes)
    log = LossLog(dev, on_gpu="no_item" in fixes)
    for _ in range(args.steps):
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev)
        labels = torch.randint(0, cfg.num_labels, (batch,), device=dev)
        train_step(lambda: model(input_ids=ids, labels=labels).loss, opt, amp, after=log)
    total = log.total()
    print(f"w_distilbert_finetune: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
          f"mean loss {total / max(args.steps, 1):.3f}")


if __name__ == "__main__":
    main()
