"""Variable-length batch inference with allocator churn: a bf16 BERT-base encoder (HF BertModel,
random weights) on batches of 32 sequences whose padded length changes every batch (128, 256,
384 or 512 tokens: requests are padded to a multiple of 128, as a request queue delivers them),
calling ``torch.cuda.empty_cache()`` after each batch "against fragmentation". (Padding to a
multiple keeps the number of shapes small, so per-shape set-up such as attention plans is done
in the first, warm-up batches and does not mix with the allocator's cost.)

Each batch (fresh random token ids) is an NVTX range ``infer`` holding ``forward`` and
``release``; predictions stay on the GPU until the end.

Defect: every batch's activations are a new set of shapes, and ``empty_cache()`` hands all the
cached blocks back to the driver after each batch, so each batch starts with fresh
``cudaMalloc`` calls, and ``empty_cache()`` itself synchronises the device: the CPU can never
queue a batch ahead of the GPU.

    python w_varlen_empty_cache_infer.py [--steps 40] [--fix no_empty_cache | --fix expandable_segments]

Fixes:
  no_empty_cache       drop the call: the caching allocator splits and reuses its cached
                       blocks across lengths; after the first few batches there is no
                       ``cudaMalloc`` at all, and no synchronisation.
  expandable_segments  ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (set in the program
                       before CUDA starts), PyTorch's own remedy for fragmentation, keeping the
                       ``empty_cache()`` call: segments grow and shrink by mapping pages instead
                       of ``cudaMalloc``/``cudaFree``, but ``empty_cache()`` still synchronises
                       and still unmaps everything. Expected little or no gain.
"""
from __future__ import annotations

import argparse
import os
import random

import torch
from transformers import BertConfig, BertModel

from _corpus import nvtx, parse_fixes  # noqa: E402 (the workloads' shared helpers)

FIXES = ("no_empty_cache", "expandable_segments")
CUDA_ONLY: tuple[str, ...] = ()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="batches (the first ones are warm-up)")
    ap.add_argument("--fix", action="append", default=[], help="fixes, repeatable or comma-separated: "
                    + ", ".join(FIXES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="tiny model and batch, for a CPU smoke run")
    args = ap.parse_args()
    fixes = parse_fixes(ap, args, FIXES, CUDA_ONLY)
    if "expandable_segments" in fixes:
        # Read when CUDA's allocator starts, so it must be set before the first CUDA call.
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(filter(None, [conf, "expandable_segments:True"]))
        if torch.cuda.is_initialized():  # too late for the variable: set it on the live allocator
            torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    dev = torch.device(args.device)
    torch.manual_seed(0)
    lengths = random.Random(0)

    if args.small:
        cfg = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128, max_position_embeddings=64)
        batch, multiple = 2, 16
    else:
        cfg = BertConfig()  # bert-base: 12 layers, hidden 768, 12 heads, up to 512 positions
        batch, multiple = 32, 128
    model = BertModel(cfg).to(dev, torch.bfloat16).eval()

    preds = []
    with torch.no_grad():
        for _ in range(args.steps):
            seq = multiple * lengths.randint(1, 4)  # this batch's padded length
            ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev)
            with nvtx("infer"):
                with nvtx("forward"):
                    preds.append(model(input_ids=ids).pooler_output.argmax(-1))
                with nvtx("release"):
                    if "no_empty_cache" not in fixes and dev.type == "cuda":
                        torch.cuda.empty_cache()  # the defect
    if dev.type == "cuda":
        torch.cuda.synchronize()
    print(f"w_varlen_empty_cache_infer: {args.steps} batches, fixes {sorted(fixes) or 'none'}, "
          f"pred histogram max {torch.cat(preds).bincount().max().item()}")


if __name__ == "__main__":
    main()
