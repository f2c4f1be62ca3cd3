"""GPT-2 training step (HF GPT2LMHeadModel, 6 layers, random weights) that calls
``torch.cuda.empty_cache()`` at the end of every step, "to keep memory low".

bf16 autocast, AdamW with PyTorch's default implementation (foreach on CUDA), batch 8 x 512
tokens, fresh random token ids every step. Each step is an NVTX range ``train_step`` holding
``forward``, ``backward`` and ``optimizer``.

Defect: ``empty_cache()`` hands every cached block back to the driver. It synchronises the
device (the CPU can no longer run ahead of the GPU), and the next step's activations and
gradients are all fresh ``cudaMalloc`` calls, each slow and each a gap on the GPU.

    python w_gpt2_empty_cache.py [--steps 40] [--fix no_empty_cache,fused_adamw]

Fixes:
  no_empty_cache  drop the ``empty_cache()`` call: the caching allocator reuses last step's
                  blocks and the CPU queues the next step while the GPU runs this one.
  fused_adamw     ``AdamW(fused=True)``: one fused kernel a parameter group instead of about
                  ten foreach passes over the fp32 weights and states (~82M parameters).
"""
from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from _corpus import bf16_autocast, finish, program_args, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("no_empty_cache", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY)

    if args.small:
        cfg = GPT2Config(vocab_size=1000, n_positions=128, n_embd=64, n_layer=2, n_head=2)
        batch, seq = 2, 32
    else:
        cfg = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=6, n_head=12)
        batch, seq = 8, 512
    model = GPT2LMHeadModel(cfg).to(dev).train()  # fp32 master weights
    # Default AdamW picks the foreach implementation on CUDA; fused=True is the fix.
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if "fused_adamw" in fixes else None)

    def release(_loss: torch.Tensor) -> None:
        if "no_empty_cache" not in fixes and dev.type == "cuda":
            torch.cuda.empty_cache()  # the defect: every cached block back to the driver

    for _ in range(args.steps):
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev)
        loss = train_step(lambda: model(input_ids=ids, labels=ids).loss, opt,
                          bf16_autocast(dev), after=release)
    finish(dev)
    print(f"w_gpt2_empty_cache: {args.steps} steps, fixes {sorted(fixes) or 'none'}, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
