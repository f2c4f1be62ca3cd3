"""HF `generate()` decode with no NVTX at all: a 4-layer Llama (random weights), bf16, batch 1.

    python generate_llama.py [--new-tokens 64] [--static]

``--static`` is the expert's fix for a host-bound decode loop: a static KV cache, with which
transformers compiles the decoding forward (mode="reduce-overhead"), so each token replays a
CUDA graph.
"""
from __future__ import annotations

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--static", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                      num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=16,
                      max_position_embeddings=2048)
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    kw = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
              pad_token_id=0)
    if args.static:
        model.generation_config.cache_implementation = "static"  # generate() then compiles
    prompt = torch.randint(0, cfg.vocab_size, (1, 32), device="cuda")
    for r in range(args.runs):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompt, **kw)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        print(f"run {r}: {out.shape[1] - prompt.shape[1]} tokens in {dt * 1e3:.1f} ms "
              f"({dt / args.new_tokens * 1e3:.2f} ms/token)")


if __name__ == "__main__":
    main()
