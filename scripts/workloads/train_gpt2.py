"""A real training step of a GPT-2 (4 layers, random weights) whose vocabulary, 50257, is not a
multiple of 8: the LM-head GEMMs run on unaligned dimensions. bf16 autocast, fused AdamW.

Each step is an NVTX range `train_step` holding `forward`, `backward` and `optimizer`.

    python train_gpt2.py [--steps 12] [--pad-vocab]

``--pad-vocab`` applies what profkit's GEMM-alignment rule suggests: the embedding (tied to the
LM head) padded to a multiple of 64 with ``resize_token_embeddings(pad_to_multiple_of=64)``.
"""
from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--pad-vocab", action="store_true", help="pad the vocabulary to a multiple of 64")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=4, n_head=12)
    model = GPT2LMHeadModel(cfg)
    if args.pad_vocab:
        model.resize_token_embeddings(cfg.vocab_size, pad_to_multiple_of=64)
    model = model.cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    # Labels stay in the real vocabulary: the padded rows are never a target.
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device="cuda")
    nvtx = torch.cuda.nvtx
    for _ in range(args.steps):
        with nvtx.range("train_step"):
            with nvtx.range("forward"), torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            with nvtx.range("backward"):
                loss.backward()
            with nvtx.range("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    print(f"loss {loss.item():.3f}, vocab rows {model.get_input_embeddings().weight.shape[0]}")


if __name__ == "__main__":
    main()
