"""Parameter-efficient fine-tuning: LoRA adapters on a frozen causal language model, written the
way PEFT injects them. HF ``LlamaForCausalLM`` from a ``LlamaConfig`` (16 layers, hidden 1024,
16 heads, SwiGLU MLP of 2816, vocabulary 32000; random weights, 270M parameters, all frozen in
fp32), each attention's q, k, v and o projections wrapped by a ``LoRALinear``: the frozen layer
plus ``dropout(x) @ A^T @ B^T * alpha / r`` (r = 16, alpha = 32, dropout 0.05; 64 adapters,
2.1M trainable parameters). bf16 autocast over the forward and the loss, AdamW (PyTorch's
default: foreach on CUDA) over the adapters, batch 8 x 512 tokens made on the GPU; no read of
the loss inside the step.

Each step is an NVTX range ``train_step`` holding ``forward``, ``backward`` and ``optimizer``.

Defects, each small: autocast casts the frozen fp32 weights to bf16 again at every use (its
cast cache keeps only tensors that require gradients); each adapter adds a dropout pass over its
input, two skinny GEMMs (rank 16) and a scale-and-add, forward and backward, 64 times; the
optimizer's foreach passes over 128 small tensors.

    python w_lora_finetune_train.py [--steps 40] [--fix bf16_base] [--fix compile] [--fix fused_adamw]

Fixes:
  bf16_base    the frozen base model cast to bf16 once (the adapters stay fp32, as PEFT keeps
               them), so autocast has no weight to cast.
  compile      ``torch.compile(model)`` (default mode).
  fused_adamw  ``AdamW(fused=True)`` for the adapters.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("bf16_base", "compile", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()
RANK, ALPHA, DROPOUT = 16, 32, 0.05
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update, as PEFT's ``lora.Linear``: B starts
    at zero, so the adapted model starts as the base one."""

    def __init__(self, base: nn.Linear, rank: int, alpha: int, dropout: float) -> None:
        super().__init__()
        self.base, self.scale = base, alpha / rank
        self.dropout = nn.Dropout(dropout)
        w = base.weight
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=w.device, dtype=torch.float32))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=w.device, dtype=torch.float32))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B) * self.scale


def add_adapters(model: nn.Module) -> list[nn.Parameter]:
    """Freeze ``model`` and wrap its attention projections; returns the adapters' parameters."""
    model.requires_grad_(False)
    wrapped = []
    for module in list(model.modules()):
        for name in TARGETS:
            child = getattr(module, name, None)
            if isinstance(child, nn.Linear):
                lora = LoRALinear(child, RANK, ALPHA, DROPOUT)
                setattr(module, name, lora)
                wrapped.append(lora)
    return [p for lora in wrapped for p in (lora.lora_A, lora.lora_B)]


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The adapted model and optimizer with ``fixes`` applied; returns one training step (fresh
    token ids; the step's loss, kept on the GPU)."""
    cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048)
    batch, seq = 8, 512
    if args.small:
        cfg = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
        batch, seq = 2, 32
    cfg.use_cache = False
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(dev)
    if "bf16_base" in fixes:
        model.to(torch.bfloat16)          # before the adapters: they stay fp32
    params = add_adapters(model)
    model.train()
    opt = torch.optim.AdamW(params, lr=2e-4, weight_decay=0.0, fused=True if "fused_adamw" in fixes else None)
    net = torch.compile(model) if "compile" in fixes else model
    amp = bf16_autocast(dev)

    def step() -> torch.Tensor:
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev)
        return train_step(lambda: net(input_ids=ids, labels=ids).loss, opt, amp).detach()
    step.trainable = sum(p.numel() for p in params)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_lora_finetune_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}, trainable parameters {ran[0].trainable}")


if __name__ == "__main__":
    main()
