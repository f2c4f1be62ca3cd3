"""A real training step: a 2-layer HF Llama (random weights), bf16 autocast, AdamW.

Each step is an NVTX range `train_step` holding `forward`, `backward` and `optimizer`; the
backward kernels are launched by PyTorch's autograd thread, not the thread that opened the
range. One middle step is also wrapped in `ncu_iter`, so `profkit capture --ncu --ncu-range
ncu_iter` profiles one whole steady-state iteration.

    python train_llama.py [--steps 12] [--fused] [--compile] [--attn eager] [--kineto trace.json.gz]
    python train_llama.py --interleave OUT.json --variants baseline,fused,compile

``--compile`` applies what profkit's host-overhead rule suggests for this host-bound step: the
model's forward and backward under torch.compile(mode="reduce-overhead") (Inductor kernels replayed
as CUDA graphs) and the optimizer step under torch.compile (its foreach kernels fused).
``--attn eager`` runs HF's own attention (GEMM, fp32 softmax, GEMM: the math path) instead of
SDPA, the program profkit's attention rule is for.
"""
from __future__ import annotations

import argparse
import contextlib
from typing import Callable

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from _corpus import check_interleave, interleave, interleave_args  # noqa: E402 (the workloads' shared helpers)


def build(args, fused: bool, compiled: bool) -> Callable[[], torch.Tensor]:
    """The model, its AdamW and the batch (``fused``: AdamW(fused=True); ``compiled``: the model
    and the optimizer step compiled); returns one annotated training step (its loss)."""
    cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                      num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=16,
                      max_position_embeddings=2048)
    cfg._attn_implementation = args.attn
    model = LlamaForCausalLM(cfg).cuda().train()          # fp32 master weights
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4,
                            **({"fused": True} if fused else {"foreach": True}))
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device="cuda")
    step_opt = opt.step
    if compiled:
        model = torch.compile(model, mode="reduce-overhead")
        step_opt = torch.compile(opt.step)
    nvtx = torch.cuda.nvtx

    def step(ncu: bool = False) -> torch.Tensor:
        mark = nvtx.range("ncu_iter") if ncu else contextlib.nullcontext()
        with mark, nvtx.range("train_step"):
            if compiled:
                torch.compiler.cudagraph_mark_step_begin()
            with nvtx.range("forward"), torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            with nvtx.range("backward"):
                loss.backward()
            with nvtx.range("optimizer"):
                step_opt()
                opt.zero_grad(set_to_none=True)
        return loss
    return step


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
    interleave_args(ap)
    args = ap.parse_args()
    fixes = {f for f, on in (("fused", args.fused), ("compile", args.compile)) if on}
    check_interleave(ap, args, fixes, ("fused", "compile"))
    torch.manual_seed(0)
    if args.interleave:
        if args.kineto:
            ap.error("--kineto records one run of its own: not with --interleave")
        interleave({n: build(args, "fused" in fx, "compile" in fx) for n, fx in args.variant_fixes.items()},
                   args.variant_fixes, args.interleave, torch.device("cuda"), rounds=args.rounds)
        return
    step = build(args, args.fused, args.compile)
    prof = contextlib.nullcontext()
    if args.kineto:
        # No schedule: every step is recorded, each marked ProfilerStep#N by p.step().
        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
    with prof as p:
        for i in range(args.steps):
            loss = step(ncu=i == args.steps // 2)
            if p is not None:
                p.step()
    torch.cuda.synchronize()
    if args.kineto:
        p.export_chrome_trace(args.kineto)
    print(f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
