"""A real training step: a 2-layer HF Llama (random weights), bf16 autocast, AdamW.

Each step is an NVTX range `train_step` holding `forward`, `backward` and `optimizer`; the
backward kernels are launched by PyTorch's autograd thread, not the thread that opened the
range. One middle step is also wrapped in `ncu_iter`, so `profkit capture --ncu --ncu-range
ncu_iter` profiles one whole steady-state iteration.

    python train_llama.py [--steps 12] [--fused] [--compile] [--attn eager] [--kineto trace.json.gz]

``--compile`` applies what profkit's host-overhead rule suggests for this host-bound step: the
model's forward and backward under torch.compile(mode="reduce-overhead") (Inductor kernels replayed
as CUDA graphs) and the optimizer step under torch.compile (its foreach kernels fused).
``--attn eager`` runs HF's own attention (GEMM, fp32 softmax, GEMM: the math path) instead of
SDPA, the program profkit's attention rule is for.
"""
from __future__ import annotations

import argparse
import contextlib

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--fused", action="store_true", help="AdamW(fused=True) instead of foreach")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (mode=reduce-overhead) and the optimizer step")
    ap.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa",
                    help="attention implementation (eager: GEMM + softmax + GEMM)")
    ap.add_argument("--kineto", default=None, help="also write a torch.profiler trace here")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                      num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=16,
                      max_position_embeddings=2048)
    cfg._attn_implementation = args.attn
    model = LlamaForCausalLM(cfg).cuda().train()          # fp32 master weights
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4,
                            **({"fused": True} if args.fused else {"foreach": True}))
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device="cuda")
    step_opt = opt.step
    if args.compile:
        model = torch.compile(model, mode="reduce-overhead")
        step_opt = torch.compile(opt.step)
    nvtx = torch.cuda.nvtx
    prof = contextlib.nullcontext()
    if args.kineto:
        # No schedule: every step is recorded, each marked ProfilerStep#N by p.step().
        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
    with prof as p:
        for i in range(args.steps):
            mark = nvtx.range("ncu_iter") if i == args.steps // 2 else contextlib.nullcontext()
            with mark, nvtx.range("train_step"):
                if args.compile:
                    torch.compiler.cudagraph_mark_step_begin()
                with nvtx.range("forward"), torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(input_ids=ids, labels=ids).loss
                with nvtx.range("backward"):
                    loss.backward()
                with nvtx.range("optimizer"):
                    step_opt()
                    opt.zero_grad(set_to_none=True)
            if p is not None:
                p.step()
    torch.cuda.synchronize()
    if args.kineto:
        p.export_chrome_trace(args.kineto)
    print(f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
