"""HF ``generate()`` greedy decode, batch 1, of a 4-layer Llama (random weights, bf16): the
program of ``generate_llama.py``, with each decode iteration marked by an NVTX range.

``generate()`` has no NVTX of its own, and a forward hook cannot hold the range once
transformers compiles the decoding forward (the hook would be traced into the compiled code).
So the ranges are opened by a logits processor, which ``generate()`` calls once a token, in
Python, after the forward: each call closes the previous ``decode_step`` range and opens the
next. One range is thus one whole decode iteration (the next token's forward, logits
processing, token selection, stopping checks). Prefill runs outside the ranges. ``--steps``
tokens are generated per ``generate()`` call, ``--runs`` measured calls in a row, after one
warm-up call outside any range (the first call pays per-shape set-up at each new KV length,
and, with the fixes, compilation and CUDA-graph recording).

    python w_generate_llama_nvtx.py [--steps 40] [--runs 3] [--arch qwen2]
                                    [--fix static | --fix graphs]

``--arch qwen2``: a deeper, narrower decoder of another family instead, shaped like
Qwen2.5-0.5B (24 layers, 896 wide, grouped-query attention with 2 KV heads, a 151,936-token
vocabulary, tied embeddings): about six times the launches a token, a program the step model
was not built on.

The eager baseline is host-bound: about 150 small kernels a token, each launched from HF's
Python code, a few microseconds of GPU work apiece.

Fixes:
  static  ``cache_implementation="static"``: a static KV cache, with which transformers
          compiles the decoding forward (torch.compile, default mode). Fewer, fused kernels
          launched from Inductor's generated code; compilation during the warm-up call.
  graphs  static cache plus ``CompileConfig(fullgraph=True, dynamic=False,
          mode="reduce-overhead")``: the compiled decode forward is recorded as a CUDA graph
          (CUDA graph trees) and replayed every token: one launch a token for the forward.
          What is left of a token's time is then ``generate()``'s own Python (input
          preparation, logits processors, stopping checks), so it gains little over ``static``.
"""
from __future__ import annotations

import argparse

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, LogitsProcessor, LogitsProcessorList, Qwen2Config,
                          Qwen2ForCausalLM)

from _corpus import nvtx, parse_fixes  # noqa: E402 (the workloads' shared helpers)

FIXES = ("static", "graphs")
CUDA_ONLY = ("graphs",)


class DecodeStepRanges(LogitsProcessor):
    """Marks decode iterations: each call (one a token) ends the open ``decode_step`` range and
    opens the next; ``close()`` ends the last one after ``generate()`` returns."""

    def __init__(self) -> None:
        self.open = None

    def close(self) -> None:
        if self.open is not None:
            self.open.__exit__(None, None, None)
            self.open = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.close()
        self.open = nvtx("decode_step")
        self.open.__enter__()
        return scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="new tokens per generate() call")
    ap.add_argument("--runs", type=int, default=3, help="generate() calls")
    ap.add_argument("--fix", action="append", default=[], help="fixes, repeatable or comma-separated: "
                    + ", ".join(FIXES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="tiny model, for a CPU smoke run")
    ap.add_argument("--arch", default="llama", choices=("llama", "qwen2"))
    args = ap.parse_args()
    fixes = parse_fixes(ap, args, FIXES, CUDA_ONLY)
    dev = torch.device(args.device)
    torch.manual_seed(0)

    if args.arch == "qwen2" and args.small:
        cfg = Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    elif args.arch == "qwen2":
        cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                          num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=2048,
                          tie_word_embeddings=True)
    elif args.small:
        cfg = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512)
    else:
        cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                          num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=16,
                          max_position_embeddings=2048)
    arch = Qwen2ForCausalLM if args.arch == "qwen2" else LlamaForCausalLM
    model = arch(cfg).to(dev, torch.bfloat16).eval()
    if fixes & {"static", "graphs"}:
        model.generation_config.cache_implementation = "static"  # generate() then compiles
    if "graphs" in fixes:
        from transformers import CompileConfig
        model.generation_config.compile_config = CompileConfig(
            fullgraph=True, dynamic=False, backend="inductor", mode="reduce-overhead")
    kw = dict(max_new_tokens=args.steps, min_new_tokens=args.steps, do_sample=False, pad_token_id=0)

    marker = DecodeStepRanges()
    with torch.no_grad():
        # One generate() before the measured ones, outside any range, as benchmarks of generate()
        # do: the first call pays per-shape set-up at every new KV length (attention plans,
        # GEMM heuristics) and, with the fixes, compilation and graph recording.
        model.generate(torch.randint(0, cfg.vocab_size, (1, 32), device=dev), **kw)
        for _ in range(args.runs):
            prompt = torch.randint(0, cfg.vocab_size, (1, 32), device=dev)  # the next request
            out = model.generate(prompt, logits_processor=LogitsProcessorList([marker]), **kw)
            marker.close()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    print(f"w_generate_llama_nvtx: {args.runs} x {out.shape[1] - 32} tokens, "
          f"fixes {sorted(fixes) or 'none'}, last token {out[0, -1].item()}")


if __name__ == "__main__":
    main()
