"""A training step that is already well tuned: HF ``LlamaForCausalLM`` from a ``LlamaConfig`` (12
layers, hidden 1024, 16 heads of 64, SwiGLU MLP of 2816, vocabulary 32768: every size a multiple
of 64; random weights, 220M parameters), SDPA attention (HF's default), bf16 autocast over fp32
weights, the model under ``torch.compile`` (default mode), ``AdamW(fused=True)``, batch 8 x
1024 tokens made on the GPU, the KV cache off, and nothing read back in the loop: the loss is
summed on the GPU and read once after the last step.

Each step is an NVTX range ``train_step`` holding ``forward``, ``backward`` and ``optimizer``.
Compilation happens during the first steps, which are warm-up (tens of seconds the first time
on a machine).

The step is GEMMs and FlashAttention (about 12 TFLOP) plus Inductor's fused element-wise
kernels, queued by a CPU that stays ahead of the GPU: there is little left to gain.

    python w_tuned_gpt_train.py [--steps 40] [--fix reduce_overhead] [--fix tf32] [--fix expandable_segments]

Fixes (none expected to pay more than 5%):
  reduce_overhead      ``torch.compile(model, mode="reduce-overhead")``: the compiled forward and
                       backward replayed as CUDA graphs (``cudagraph_mark_step_begin()`` each
                       step); removes launch overhead that the GPU-bound step already hides.
  tf32                 ``torch.set_float32_matmul_precision("high")``: under bf16 autocast no
                       fp32 matrix product is left for TF32 to speed up.
  expandable_segments  ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` set before CUDA
                       starts: the caching allocator maps growable segments instead of fixed
                       blocks; the step's allocations are already served from the cache after
                       warm-up. Not interleavable: the allocator reads it once per process.
"""
from __future__ import annotations

import os
from typing import Callable

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from _corpus import bf16_autocast, program_args, run, set_precision, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("reduce_overhead", "tf32", "expandable_segments")
CUDA_ONLY = ("reduce_overhead", "expandable_segments")


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The compiled model and fused optimizer with ``fixes`` applied; returns one training step
    (fresh token ids; the running loss sum, on the GPU: with CUDA graphs a step's own loss is
    overwritten by the next replay). ``step.total()`` reads the sum once."""
    set_precision(fixes)
    cfg = LlamaConfig(vocab_size=32768, hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048)
    batch, seq = 8, 1024
    if args.small:
        cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
        batch, seq = 2, 32
    cfg.use_cache = False
    model = LlamaForCausalLM(cfg).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95), fused=True)
    graphs = "reduce_overhead" in fixes
    cmodel = torch.compile(model, mode="reduce-overhead" if graphs else None)
    amp = bf16_autocast(dev)
    running = torch.zeros((), device=dev)

    def step() -> torch.Tensor:
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev)
        # with graphs, a new iteration: the graphs may overwrite the previous step's outputs
        loss = train_step(lambda: cmodel(input_ids=ids, labels=ids).loss, opt, amp,
                          before=torch.compiler.cudagraph_mark_step_begin if graphs else None)
        running.add_(loss.detach())
        return running
    step.total = running.item
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY)
    if "expandable_segments" in fixes:  # before the first CUDA allocation, which reads it
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    ran = run(build, args, fixes, dev,
              not_interleaved={"expandable_segments": "configures the allocator once per process"})
    if ran:
        print(f"w_tuned_gpt_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"mean loss {ran[0].total() / max(args.steps, 1):.3f}")


if __name__ == "__main__":
    main()
