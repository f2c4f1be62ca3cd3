"""Fine-tuning step of a 270M-parameter HF Llama (``LlamaForCausalLM`` from a ``LlamaConfig``: 16
layers, hidden 1024, 16 heads, SwiGLU MLP of 2816, vocabulary 32000, random weights) with
``model.gradient_checkpointing_enable()``, as fine-tuning recipes switch on by default; bf16
autocast over fp32 weights, batch 8 x 1024 tokens, AdamW with PyTorch's default implementation
(foreach on CUDA).

Each step (fresh random tokens) is an NVTX range ``train_step`` holding ``forward``,
``backward`` and ``optimizer``.

Defect: checkpointing keeps only each layer's input and runs every layer's forward a second
time in the backward: about a third more GPU work (every GEMM, norm, rotary and attention
kernel of the forward again) to save memory that this model and batch do not need on a 141 GB
GPU (a few GB of activations without it).

    python w_grad_checkpoint_train.py [--steps 30] [--fix no_checkpointing] [--fix fused_adamw]
                                      [--fix compile]

Fixes:
  no_checkpointing  gradient checkpointing left off: activations kept, no recomputation.
  fused_adamw       ``AdamW(fused=True)``: one pass over the 270M fp32 weights and states
                    instead of about ten foreach passes.
  compile           ``torch.compile(model)`` (default mode), checkpointing kept: Inductor fuses the
                    norms, rotary embeddings, SwiGLU and casts of the forward, the recomputed
                    forward and the backward; the optimizer step stays eager.
"""
from __future__ import annotations

from typing import Callable

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("no_checkpointing", "fused_adamw", "compile")
CUDA_ONLY: tuple[str, ...] = ()


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and optimizer with ``fixes`` applied; returns one training step (fresh token
    ids; the step's loss)."""
    cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048)
    batch, seq = 8, 1024
    if args.small:
        cfg = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
        batch, seq = 2, 32
    cfg.use_cache = False  # (no KV cache in training; HF warns about it with checkpointing)
    model = LlamaForCausalLM(cfg).to(dev).train()
    if "no_checkpointing" not in fixes:
        model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.0,
                            fused=True if "fused_adamw" in fixes else None)
    amp = bf16_autocast(dev)
    net = torch.compile(model) if "compile" in fixes else model

    def step() -> torch.Tensor:
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev)
        return train_step(lambda: net(input_ids=ids, labels=ids).loss, opt, amp)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_grad_checkpoint_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()
