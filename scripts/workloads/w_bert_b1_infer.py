"""Batch-1 BERT-base inference (HF BertModel, random weights, bf16), one 128-token request at
a time, as an online classifier serves them.

Each request (fresh random token ids) is an NVTX range ``infer``; predictions stay on the GPU
and are read once after the loop.

The forward is about 250 kernel launches (12 layers of GEMMs, layer norms, GELU, softmax
attention, adds) of a few microseconds of GPU work each: the CPU's Python and launch path sets
the pace, and the GPU idles most of each request.

    python w_bert_b1_infer.py [--steps 40] [--fix cuda_graph | --fix compile]
    python w_bert_b1_infer.py --interleave OUT.json --variants baseline,cuda_graph,compile

Fixes:
  cuda_graph  the forward captured once in a CUDA graph (``torch.cuda.graph``) on a static
              input buffer; each request is copied into it and the graph replayed: one launch
              a request instead of ~250. (Under capture HF cannot look at the padding, so it
              builds an all-true attention mask: SDPA then takes its masked path, a small cost
              at this size.)
  compile     ``torch.compile(model)`` (default mode): Inductor fuses the element-wise work
              into fewer kernels launched from generated code, but still launches each one.
              Compilation (tens of seconds) happens in the first requests, which are warm-up.
"""
from __future__ import annotations

from typing import Callable

import torch
from transformers import BertConfig, BertModel

from _corpus import graphed, nvtx, program_args, run, set_precision  # noqa: E402 (the workloads' shared helpers)

FIXES = ("cuda_graph", "compile")
CUDA_ONLY = ("cuda_graph",)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model with ``fixes`` applied; returns one request's step (fresh token ids, the
    forward in an NVTX range ``infer``, the prediction)."""
    set_precision(fixes)
    if args.small:
        cfg = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128)
        seq = 16
    else:
        cfg = BertConfig()  # bert-base: 12 layers, hidden 768, 12 heads
        seq = 128
    model = BertModel(cfg).to(dev, torch.bfloat16).eval()  # bf16 weights, as served
    if "compile" in fixes:
        model = torch.compile(model)

    def forward(ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids).pooler_output  # no padding: no attention mask needed

    call = forward
    if "cuda_graph" in fixes:
        static_ids = torch.randint(0, cfg.vocab_size, (1, seq), device=dev)
        call = graphed(forward, static_ids)

    @torch.no_grad()
    def step() -> torch.Tensor:
        ids = torch.randint(0, cfg.vocab_size, (1, seq), device=dev)
        with nvtx("infer"):
            return call(ids).argmax(-1)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY,
                                    alternatives=({"cuda_graph", "compile"},),
                                    steps_help="requests (the first ones are warm-up)",
                                    small_help="tiny model, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_bert_b1_infer: {args.steps} requests, fixes {sorted(fixes) or 'none'}, "
              f"pred histogram max {torch.cat(ran[1]).bincount().max().item()}")


if __name__ == "__main__":
    main()
