"""HF `generate()` decode with no NVTX at all: a 4-layer Llama (random weights), bf16, batch 1.

    python generate_llama.py [--new-tokens 64] [--static [--graphs]] [--fused auto|cuda|triton]

``--static`` sets a static KV cache, with which transformers compiles the decoding forward. On
the H200 capture (torch 2.11, transformers 5.17) that compiled forward ran as ~107 Triton and
cuBLAS launches per token and no CUDA graph: half of what profkit's host-overhead rule (PK103)
assumes, which is the whole decode step replayed as one graph.

``--static --graphs`` applies what PK103 says: the decode forward compiled with
``CompileConfig(fullgraph=True, dynamic=False, mode="reduce-overhead")``, so CUDA graph trees
record it once per shape and replay it every token; one warm-up generate() (compilation, graph
recording) runs before the measured ones. It prints Inductor's CUDA-graph counters at the end
and logs why graphs were skipped, if they were (``perf_hints``).

``--fused BACKEND`` applies what profkit's PK401 suggests for HF's composed RMSNorm (eight
kernels a norm): each residual add + ``LlamaRMSNorm`` pair becomes the bundled
``kernels.add_rmsnorm`` (the decoder layers hand ``(x, residual)`` to the next one instead of
``x + residual``), and layer 0's input norm, which has no add before it,
``torch.nn.functional.rms_norm``: every norm of a token is one kernel.
"""
from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def fuse_add_rmsnorm(model: LlamaForCausalLM, backend: str) -> int:
    """Rewire the decoder so every residual add that feeds a LlamaRMSNorm runs as one
    kernels.add_rmsnorm call; returns the number of norms fused per forward.

    HF's norm is 8 kernels (to fp32, pow, mean, + eps, rsqrt, mul, to bf16, * weight) after the
    add's one; the fused op rounds x + residual to bf16 (as the add does) and normalises in fp32.
    Each patched layer returns (mlp output, residual) and adds them inside the next layer's
    fused input norm; the final norm does the last add.  Layer 0's input norm (no add before it)
    runs as F.rms_norm.  Relies on LlamaModel passing each layer's output to the next layer and
    to model.norm unchanged (transformers 5.x)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from kernels import add_rmsnorm

    def add_norm(norm, x, res):
        return add_rmsnorm(x, res, norm.weight, norm.variance_epsilon, backend=backend)

    def layer_forward(self, hidden_states, **kwargs):
        if isinstance(hidden_states, tuple):  # (x, residual) from the previous patched layer
            h, residual = add_norm(self.input_layernorm, *hidden_states)
        else:
            n = self.input_layernorm
            residual = hidden_states
            h = torch.nn.functional.rms_norm(hidden_states, n.weight.shape, n.weight, n.variance_epsilon)
        h, _ = self.self_attn(hidden_states=h, **kwargs)
        h, residual = add_norm(self.post_attention_layernorm, h, residual)
        return self.mlp(h), residual

    class FinalAddNorm(torch.nn.Module):
        def __init__(self, norm):
            super().__init__()
            self.norm = norm

        def forward(self, pair):
            return add_norm(self.norm, *pair)[0]

    layers = model.model.layers
    for layer in layers:
        layer.forward = types.MethodType(layer_forward, layer)
    model.model.norm = FinalAddNorm(model.model.norm)
    return 2 * len(layers) + 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--static", action="store_true")
    ap.add_argument("--graphs", action="store_true",
                    help="with --static: compile the decode forward with mode='reduce-overhead' "
                         "(CUDA graphs), fullgraph, static shapes; one warm-up generate()")
    ap.add_argument("--fused", choices=["auto", "cuda", "triton"], default=None,
                    help="swap residual add + RMSNorm for kernels.add_rmsnorm with this backend")
    args = ap.parse_args()
    if args.graphs and not args.static:
        ap.error("--graphs needs --static (CUDA graphs need the static KV cache's fixed addresses)")
    if args.fused and args.static:
        ap.error("--fused patches the eager model; leave out --static")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                      num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=16,
                      max_position_embeddings=2048)
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    if args.fused:
        print(f"fused RMSNorm ({args.fused}): {fuse_add_rmsnorm(model, args.fused)} norms per forward",
              flush=True)
    kw = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
              pad_token_id=0)
    if args.static:
        model.generation_config.cache_implementation = "static"  # generate() then compiles
    warmup = 0
    if args.graphs:
        from transformers import CompileConfig
        torch._logging.set_logs(perf_hints=True)  # "skipping cudagraphs due to ..." if any
        model.generation_config.compile_config = CompileConfig(
            fullgraph=True, dynamic=False, backend="inductor", mode="reduce-overhead")
        warmup = 1
    prompt = torch.randint(0, cfg.vocab_size, (1, 32), device="cuda")
    for r in range(-warmup, args.runs):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompt, **kw)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        print(f"{'warm-up' if r < 0 else f'run {r}'}: {out.shape[1] - prompt.shape[1]} tokens in "
              f"{dt * 1e3:.1f} ms ({dt / args.new_tokens * 1e3:.2f} ms/token)", flush=True)
    if args.graphs:
        from torch._dynamo.utils import counters
        print("inductor counters:", {k: v for k, v in counters["inductor"].items() if "cudagraph" in k},
              flush=True)


if __name__ == "__main__":
    main()
