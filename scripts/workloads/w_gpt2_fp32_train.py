"""GPT-2 (124M) training step in plain fp32: HF GPT2LMHeadModel, 12 layers, random weights, batch
8 x 512 tokens, AdamW with PyTorch's default implementation (foreach on CUDA), no autocast and
PyTorch's default matmul precision (full fp32: no TF32).

Each step (fresh random token ids) is an NVTX range ``train_step`` holding ``forward``,
``backward`` and ``optimizer``.

Defect: every GEMM of the forward and backward runs in full fp32 on the CUDA cores (about 51
TFLOP/s on an H200 against about 345 for TF32 and 790 for bf16): the tensor cores sit idle.

    python w_gpt2_fp32_train.py [--steps 40] [--fix tf32 | --fix bf16_autocast] [--fix fused_adamw]
    python w_gpt2_fp32_train.py --interleave OUT.json --variants baseline,tf32,bf16_autocast,fused_adamw

Fixes:
  tf32           ``torch.set_float32_matmul_precision("high")``: the fp32 GEMMs run as TF32 on
                 the tensor cores; everything else unchanged.
  bf16_autocast  the forward under ``torch.autocast("cuda", dtype=torch.bfloat16)`` (the fp32
                 weights stay the master copy): bf16 GEMMs, and the activations half the bytes.
  fused_adamw    ``AdamW(fused=True)``: one fused pass over the 124M fp32 weights and states
                 instead of about ten foreach passes.
"""
from __future__ import annotations

from typing import Callable

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from _corpus import bf16_autocast, program_args, run, set_precision, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("tf32", "bf16_autocast", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """A model and optimizer with ``fixes`` applied (each variant its own: training changes the
    weights); returns one training step (fresh token ids; its loss)."""
    set_precision(fixes)
    if args.small:
        cfg = GPT2Config(vocab_size=1000, n_positions=128, n_embd=64, n_layer=2, n_head=2)
        batch, seq = 2, 32
    else:
        cfg = GPT2Config()  # 124M: 12 layers, 768 wide, 12 heads, vocabulary 50257
        batch, seq = 8, 512
    model = GPT2LMHeadModel(cfg).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if "fused_adamw" in fixes else None)
    amp = bf16_autocast(dev, "bf16_autocast" in fixes)

    def step() -> torch.Tensor:
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev)
        return train_step(lambda: model(input_ids=ids, labels=ids).loss, opt, amp)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY,
                                    alternatives=[("tf32", "bf16_autocast")])
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_gpt2_fp32_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()
