"""T5-small fine-tuning step (HF T5ForConditionalGeneration, random weights: 6 encoder and 6
decoder layers, 512 wide, relative position bias, cross-attention) in plain fp32, batch 32 of
256 source and 64 target tokens, AdamW with PyTorch's default implementation (foreach on
CUDA), and the running loss logged every step with ``loss.item()``.

Each step is an NVTX range ``train_step`` holding ``forward``, ``backward``, ``optimizer`` and
``log``. A program the step model was not built on (an encoder-decoder, where the corpus's
other transformers are encoders or decoders alone): captured and timed in one allocation after
the model's last change.

Defects: the GEMMs run in fp32 on the CUDA cores (TF32 off by default); ``.item()`` waits for
the step's GPU work every step; AdamW's foreach passes over 60M parameters.

    python w_t5_finetune.py [--steps 40] [--fix tf32 | --fix bf16_autocast]
                            [--fix fused_adamw] [--fix no_item] [--fix compile_graphs]

Fixes:
  tf32           ``torch.set_float32_matmul_precision("high")``.
  bf16_autocast  forward and loss under ``torch.autocast(bfloat16)``.
  fused_adamw    ``AdamW(fused=True)``.
  no_item        the loss summed on the GPU and read once after the loop.
  compile_graphs the model under ``torch.compile(mode="reduce-overhead")``: Inductor's kernels,
                 replayed as CUDA graphs (forward and backward); the optimizer step and
                 ``.item()`` stay eager, between the graphs.
"""
from __future__ import annotations

from typing import Callable

import torch
from transformers import T5Config, T5ForConditionalGeneration

from _corpus import bf16_autocast, LossLog, program_args, run, set_precision, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("tf32", "bf16_autocast", "fused_adamw", "no_item", "compile_graphs")
CUDA_ONLY: tuple[str, ...] = ()


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model, optimizer and loss log with ``fixes`` applied; returns one training step
    (fresh token ids and labels; the step's loss). ``step.log`` is its loss log."""
    set_precision(fixes)
    if args.small:
        cfg = T5Config(vocab_size=1000, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
        batch, src, tgt = 2, 16, 8
    else:
        cfg = T5Config()  # t5-small: 6+6 layers, 512 wide, 8 heads, feed-forward 2048, vocabulary 32128
        batch, src, tgt = 32, 256, 64
    cfg.decoder_start_token_id = cfg.pad_token_id
    model = T5ForConditionalGeneration(cfg).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if "fused_adamw" in fixes else None)
    amp = bf16_autocast(dev, "bf16_autocast" in fixes)
    net = torch.compile(model, mode="reduce-overhead") if "compile_graphs" in fixes else model
    log = LossLog(dev, on_gpu="no_item" in fixes)

    def step() -> torch.Tensor:
        ids = torch.randint(1, cfg.vocab_size, (batch, src), device=dev)
        labels = torch.randint(1, cfg.vocab_size, (batch, tgt), device=dev)
        return train_step(lambda: net(input_ids=ids, labels=labels).loss, opt, amp, after=log)
    step.log = log
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY,
                                    alternatives=[("tf32", "bf16_autocast")])
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_t5_finetune: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"mean loss {ran[0].log.total() / max(args.steps, 1):.3f}")


if __name__ == "__main__":
    main()
