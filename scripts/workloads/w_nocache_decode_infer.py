"""Greedy decoding from a small GPT-style decoder written by hand, as a from-scratch tutorial's
``generate`` writes it: each new token runs the model over the whole sequence so far (prompt and
every token generated), takes the logits of the last position and appends their argmax. The
model: 6 pre-norm blocks of width 512 (8 heads, causal ``scaled_dot_product_attention``, GELU
MLP), learned positions, a vocabulary of 32,000 with an untied head (random weights, PyTorch's
default initialisation), fp32 as constructed. A batch of 4 prompts of 192 random tokens, 64 new
tokens each, no stopping test (every sequence runs to its length).

Each call is one generation: an NVTX range ``generate``.

Defect (if any): no KV cache. Token t's forward recomputes the keys, values and MLPs of all
192 + t positions before it, whose results are the same as at the last token: about 4 TFLOP of
fp32 GEMMs a generation (from ~770 to ~1,020 rows a forward) where one row per sequence is new;
and the head's 32,000-way GEMM runs over every position though only the last one's logits are
read (nearly half of those FLOPs).

    python w_nocache_decode_infer.py [--steps 30] [--fix kv_cache] [--fix last_logits] [--fix bf16]

Fixes:
  kv_cache     a KV cache preallocated for the whole generation ([4, 8, 256, 64] a layer, K and V):
               the prompt run once (prefill), then one token a forward, its K and V written in
               place at its position and attention reading the filled prefix (a view).
  last_logits  the head applied to the last position alone (the final LayerNorm's output
               sliced before the head), the recomputation kept.
  bf16         the model's weights and activations in bf16 (``model.to(torch.bfloat16)``).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("kv_cache", "last_logits", "bf16")
CUDA_ONLY: tuple[str, ...] = ()


class KVCache:
    """Per layer K and V for ``batch`` sequences of up to ``length`` positions, allocated once."""

    def __init__(self, layers: int, batch: int, heads: int, length: int, head_dim: int,
                 dtype: torch.dtype, dev: torch.device) -> None:
        shape = (batch, heads, length, head_dim)
        self.k = [torch.empty(shape, dtype=dtype, device=dev) for _ in range(layers)]
        self.v = [torch.empty(shape, dtype=dtype, device=dev) for _ in range(layers)]


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor, cache: Optional[KVCache] = None, layer: int = 0, pos: int = 0) -> torch.Tensor:
        """``x``: the positions ``pos`` to ``pos + T`` of each sequence; without a cache ``pos`` is 0
        and ``x`` the whole sequence."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if cache is not None:
            cache.k[layer][:, :, pos:pos + t] = k
            cache.v[layer][:, :, pos:pos + t] = v
            k, v = cache.k[layer][:, :, :pos + t], cache.v[layer][:, :, :pos + t]
        # causal over the positions given; one new token attends to everything before it (no mask)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, length: int) -> None:
        super().__init__()
        self.heads, self.length = heads, length
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(length, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor, cache: Optional[KVCache] = None, pos: int = 0,
                last_only: bool = False) -> torch.Tensor:
        """The logits of the positions ``pos`` to ``pos + T`` (of the last alone with ``last_only``)."""
        x = self.tok(ids) + self.pos(torch.arange(pos, pos + ids.shape[1], device=ids.device))
        for i, blk in enumerate(self.blocks):
            x = blk(x, cache, i, pos)
        x = self.ln(x)
        return self.head(x[:, -1:] if last_only else x)

    def cache(self, batch: int) -> KVCache:
        d = self.tok.embedding_dim
        return KVCache(len(self.blocks), batch, self.heads, self.length, d // self.heads,
                       self.tok.weight.dtype, self.tok.weight.device)


def generate(model: GPT, prompt: torch.Tensor, new: int, kv_cache: bool, last_only: bool) -> torch.Tensor:
    """Greedy decoding of ``new`` tokens after ``prompt`` (batch, length): the whole sequence (the
    prompt and the new tokens)."""
    ids = prompt
    if not kv_cache:
        for _ in range(new):
            nxt = model(ids, last_only=last_only)[:, -1].argmax(-1)
            ids = torch.cat([ids, nxt[:, None]], dim=1)
        return ids
    cache = model.cache(prompt.shape[0])
    nxt = model(prompt, cache, 0, last_only)[:, -1].argmax(-1)
    out = [prompt, nxt[:, None]]
    for t in range(prompt.shape[1], prompt.shape[1] + new - 1):
        nxt = model(nxt[:, None], cache, t, last_only)[:, -1].argmax(-1)
        out.append(nxt[:, None])
    return torch.cat(out, dim=1)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model with ``fixes`` applied; returns one generation (the prompts and their new tokens)."""
    vocab, d, heads, layers, batch, prompt_len, new = 32000, 512, 8, 6, 4, 192, 64
    if args.small:
        vocab, d, heads, layers, batch, prompt_len, new = 50, 16, 2, 2, 2, 5, 4
    torch.manual_seed(0)
    model = GPT(vocab, d, heads, layers, prompt_len + new).to(dev).eval()
    if "bf16" in fixes:
        model = model.to(torch.bfloat16)
    kv_cache, last_only = "kv_cache" in fixes, "last_logits" in fixes
    g = torch.Generator(device=dev).manual_seed(4)

    @torch.no_grad()
    def step() -> torch.Tensor:
        prompt = torch.randint(0, vocab, (batch, prompt_len), device=dev, generator=g)
        with nvtx("generate"):
            return generate(model, prompt, new, kv_cache, last_only)
    step.model = model
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    steps_help="generations (the first ones are warm-up)",
                                    small_help="tiny model and prompts, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_nocache_decode_infer: {args.steps} generations, fixes {sorted(fixes) or 'none'}, "
              f"last tokens {ran[1][-1][:, -4:].flatten().tolist()}")


if __name__ == "__main__":
    main()
