"""Token-by-token sampling from a hand-written decoder-only LM (24 pre-norm layers, hidden 1024,
16 heads: GPT-2 medium's shape; learned positions, vocabulary 32000, bf16 weights, random), batch of 4 prompts of 128
tokens, up to 256 new tokens each: temperature 0.8, top-k 50 then top-p 0.9 (sort, cumulative
softmax, mask), ``torch.multinomial``, as hand-written generation loops do it.

The KV cache grows by ``torch.cat`` along the sequence every token, in every layer. After each
token the loop checks its stopping criteria: ``if finished.all().item()`` (every prompt has
produced EOS) or the maximum length. With random weights EOS never comes: each generation runs
to 256 tokens, then the next batch of prompts is prefilled.

Each call is one token: an NVTX range ``decode`` holding ``prefill`` (only when a new batch of
prompts starts), ``forward``, ``sample`` and ``stop_check``.

Defects: about 400 small kernels a token, launched one by one (the GPU's work, ~740 MB of
weights read, is a fraction of a millisecond), so the CPU sets the pace; the cache is copied
into a new tensor in every layer every token; and the CPU waits for the GPU every token, at
``.item()`` and, less visibly, twice inside ``torch.multinomial`` (it checks the probabilities
with two ``.item()`` of its own).

    python w_kv_decode_sampling.py [--steps 600] [--fix prealloc | --fix graph] [--fix check_every_16]

Fixes:
  prealloc        a static cache ([4, 16, 384, 64] per layer, K and V) allocated once and written
                  in place at the next position; attention reads the filled prefix (a view).
  check_every_16  the stopping criteria read from the GPU every 16 tokens instead of every
                  token (EOS still tracked every token on the GPU); multinomial's own waits stay.
  graph           the static cache with the position in a GPU tensor (attention over the whole
                  cache, masked beyond it) and the decode step (forward, top-k/top-p, sampling,
                  the token fed back, the position advanced) captured in one CUDA graph and
                  replayed per token. Sampling inside the graph draws with the exponential race
                  (``argmax(p / Exp(1))``, the algorithm multinomial itself uses) without its
                  checks, which cannot be captured. The stop check stays every token.
"""
from __future__ import annotations

import itertools
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import capture, nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("prealloc", "check_every_16", "graph")
CUDA_ONLY = ("graph",)
EOS, TEMPERATURE, TOP_K, TOP_P = 2, 0.8, 50, 0.9


class CatCache:
    """The growing cache: per layer K and V, extended with ``torch.cat`` each call."""

    def __init__(self, layers: int, max_len: int, dev: torch.device) -> None:
        self.k: list[Optional[torch.Tensor]] = [None] * layers
        self.v: list[Optional[torch.Tensor]] = [None] * layers
        self.len, self.arange = 0, torch.arange(max_len, device=dev)

    def reset(self) -> None:
        self.k, self.v, self.len = [None] * len(self.k), [None] * len(self.v), 0

    def positions(self, n: int) -> torch.Tensor:
        return self.arange[self.len:self.len + n]

    def update(self, i: int, k: torch.Tensor, v: torch.Tensor):
        if self.k[i] is not None:
            k, v = torch.cat([self.k[i], k], dim=2), torch.cat([self.v[i], v], dim=2)
        self.k[i], self.v[i] = k, v
        return k, v, None


class StaticCache(CatCache):
    """Preallocated [layers, B, H, max_len, hd] buffers written in place. ``on_gpu``: the
    position is the GPU tensor ``pos`` (for capture), the whole cache attended, masked past it."""

    def __init__(self, layers: int, b: int, h: int, max_len: int, hd: int, dev: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__(layers, max_len, dev)
        self.kb = torch.zeros(layers, b, h, max_len, hd, device=dev, dtype=dtype)
        self.vb = torch.zeros_like(self.kb)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.on_gpu = False

    def reset(self) -> None:
        self.len = 0

    def positions(self, n: int) -> torch.Tensor:
        return self.pos if self.on_gpu else super().positions(n)

    def update(self, i: int, k: torch.Tensor, v: torch.Tensor):
        if self.on_gpu:
            self.kb[i].index_copy_(2, self.pos, k)
            self.vb[i].index_copy_(2, self.pos, v)
            return self.kb[i], self.vb[i], (self.arange <= self.pos).view(1, 1, 1, -1)
        n = k.shape[2]
        self.kb[i][:, :, self.len:self.len + n] = k
        self.vb[i][:, :, self.len:self.len + n] = v
        return self.kb[i][:, :, :self.len + n], self.vb[i][:, :, :self.len + n], None


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor, cache: CatCache, i: int) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        k, v, mask = cache.update(i, k, v)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and s > 1)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class LM(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, max_len: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor, cache: CatCache) -> torch.Tensor:
        """Logits of the last position; ``ids`` appended to the cache."""
        x = self.tok(ids) + self.pos(cache.positions(ids.shape[1]))
        for i, blk in enumerate(self.blocks):
            x = blk(x, cache, i)
        cache.len += ids.shape[1]
        return self.head(self.ln(x[:, -1]))


def sample(logits: torch.Tensor, graph_safe: bool = False) -> torch.Tensor:
    """Temperature, top-k, top-p, then one draw per row: [B, 1] token ids."""
    logits = logits.float() / TEMPERATURE
    kth = torch.topk(logits, TOP_K).values[:, -1:]
    logits = logits.masked_fill(logits < kth, float("-inf"))
    sorted_logits, sorted_idx = torch.sort(logits, descending=True)
    sorted_probs = sorted_logits.softmax(-1)
    drop_sorted = sorted_probs.cumsum(-1) - sorted_probs > TOP_P  # the mass before it is over p
    logits = logits.masked_fill(drop_sorted.scatter(1, sorted_idx, drop_sorted), float("-inf"))
    probs = logits.softmax(-1)
    if graph_safe:
        return probs.div(torch.empty_like(probs).exponential_()).argmax(-1, keepdim=True)
    return torch.multinomial(probs, 1)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model, cache and prompt pool with ``fixes`` applied; returns one decode step (a new
    batch of prompts prefilled first when the last generation ended; the tokens so far)."""
    vocab, d, heads, layers, batch, prompt, max_new = 32000, 1024, 16, 24, 4, 128, 256
    if args.small:
        vocab, d, heads, layers, batch, prompt, max_new = 256, 32, 4, 2, 2, 8, 12
    max_len, dtype = prompt + max_new, torch.bfloat16
    model = LM(vocab, d, heads, layers, max_len).to(dev, dtype).eval()
    static = "prealloc" in fixes or "graph" in fixes
    cache = StaticCache(layers, batch, heads, max_len, d // heads, dev, dtype) if static \
        else CatCache(layers, max_len, dev)
    gen = torch.Generator(device=dev).manual_seed(1)
    prompts = itertools.cycle([torch.randint(3, vocab, (batch, prompt), device=dev, generator=gen)
                               for _ in range(4)])
    every = 16 if "check_every_16" in fixes else 1
    state = {"done": True}

    @torch.inference_mode()
    def prefill() -> None:
        cache.reset()
        ids = next(prompts)
        tok = sample(model(ids, cache))
        state.update(done=False, tok=tok, tokens=torch.cat([ids, tok], 1), n_new=1, finished=tok[:, 0] == EOS)
        if "graph" in fixes:
            cache.pos.fill_(cache.len)
            static_tok.copy_(tok)

    if "graph" in fixes:
        static_tok = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        prefill()  # a valid cache and position for the warm-up and the capture

        def decode_once(_: torch.Tensor) -> torch.Tensor:
            nxt = sample(model(static_tok, cache), graph_safe=True)
            static_tok.copy_(nxt)  # fed back as the next input
            cache.pos.add_(1)
            return static_tok

        cache.on_gpu = True
        graph, _ = capture(decode_once, static_tok)
        cache.on_gpu = False  # the prefill stays eager, on the filled prefix
        state["done"] = True

    @torch.inference_mode()
    def step() -> torch.Tensor:
        with nvtx("decode"):
            if state["done"]:
                with nvtx("prefill"):
                    prefill()
            if "graph" in fixes:
                with nvtx("forward"):
                    graph.replay()  # forward and sampling; the token lands in static_tok
                tok = static_tok
            else:
                with nvtx("forward"):
                    logits = model(state["tok"], cache)
                with nvtx("sample"):
                    tok = sample(logits)
            state["tokens"] = torch.cat([state["tokens"], tok], 1)
            state["finished"] |= tok[:, 0] == EOS
            state["tok"], state["n_new"] = tok, state["n_new"] + 1
            with nvtx("stop_check"):
                if state["n_new"] >= max_new:
                    state["done"] = True
                elif state["n_new"] % every == 0 and state["finished"].all().item():
                    state["done"] = True
        return state["tokens"]
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=600,
                                    alternatives=[("prealloc", "graph")],
                                    steps_help="tokens (generations of 256 follow one another)")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_kv_decode_sampling: {args.steps} tokens, fixes {sorted(fixes) or 'none'}, "
              f"last sequence length {ran[1][-1].shape[1]}")


if __name__ == "__main__":
    main()
