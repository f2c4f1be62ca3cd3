"""BERT-base encoder inference (HF BertModel, random weights) in plain fp32, batch 32 x 256
tokens: GPU-bound, the matrix products run on fp32 FMA units.

Each batch (fresh random token ids) is an NVTX range ``infer``; the pooled output is reduced to
a prediction on the GPU and read once after the loop.

PyTorch's default leaves fp32 matrix products in full fp32 (no TF32), so about 1.5 TFLOP a
batch run at fp32 speed: tens of ms a batch on an H200, far above the ~2 ms the CPU needs to
launch the forward.

    python w_bert_fp32_infer.py [--steps 40] [--fix tf32 | --fix bf16_autocast | --fix cuda_graph]
    python w_bert_fp32_infer.py --interleave OUT.json --variants baseline,tf32,bf16_autocast

Fixes:
  tf32           ``torch.set_float32_matmul_precision("high")``: the fp32 GEMMs run on tensor
                 cores in TF32. Pays: the step is GEMM-bound.
  bf16_autocast  the forward under ``torch.autocast("cuda", dtype=torch.bfloat16)``: bf16 GEMMs
                 and attention, and half the activation traffic. Pays, a bit more than tf32.
  cuda_graph     the forward captured in a CUDA graph on a static input and replayed: removes
                 launch overhead, which this GPU-bound step does not have. Expected no gain,
                 and a small loss: under capture HF cannot look at the (absent) padding, so it
                 builds an all-true attention mask and SDPA takes its slower masked fp32 path.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
from transformers import BertConfig, BertModel

from _corpus import graphed, nvtx, program_args, run, set_precision  # noqa: E402 (the workloads' shared helpers)

FIXES = ("tf32", "bf16_autocast", "cuda_graph")
CUDA_ONLY = ("cuda_graph",)


_MODELS: dict = {}  # one model a process: the fixes leave the weights as they are


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The forward with ``fixes`` applied, on the process's one model (interleaved variants
    share its weights); returns one batch's step (fresh token ids, the forward in an NVTX range
    ``infer``, the predictions)."""
    set_precision(fixes)
    if args.small:
        cfg = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128)
        batch, seq = 2, 16
    else:
        cfg = BertConfig()  # bert-base: 12 layers, hidden 768, 12 heads, vocab 30522
        batch, seq = 32, 256
    if dev not in _MODELS:
        _MODELS[dev] = BertModel(cfg).to(dev).eval()
    model = _MODELS[dev]
    # No attention mask: full-length batches, and HF then needs no mask (no data-dependent check).
    # (autocast's weight-cast cache must be off where a CUDA graph is captured)
    amp = (torch.autocast(dev.type, dtype=torch.bfloat16, cache_enabled="cuda_graph" not in fixes)
           if "bf16_autocast" in fixes else contextlib.nullcontext())

    def forward(ids: torch.Tensor) -> torch.Tensor:
        with amp:
            return model(input_ids=ids).pooler_output

    call = forward
    if "cuda_graph" in fixes:
        static_ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev)
        call = graphed(forward, static_ids)

    @torch.no_grad()
    def step() -> torch.Tensor:
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev)
        with nvtx("infer"):
            return call(ids).argmax(-1)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY,
                                    steps_help="batches (the first ones are warm-up)")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_bert_fp32_infer: {args.steps} batches, fixes {sorted(fixes) or 'none'}, "
              f"last preds {ran[1][-1][:4].tolist()}")


if __name__ == "__main__":
    main()
