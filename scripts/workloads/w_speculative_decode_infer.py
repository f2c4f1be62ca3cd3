"""Greedy speculative decoding written by hand, as a research prototype of the idea writes it: a
target GPT-style decoder (12 pre-norm layers, width 768, 12 heads, learned positions, vocabulary
32,000; PyTorch's default initialisation, random, bf16 weights) and a draft of 2 layers of the
same width that shares the target's embeddings, final LayerNorm and head (as drafts trained beside
their target do). With random weights the draft's argmax is the target's at about one position in
five (the shared embeddings carry much of the residual stream; the target's ten other blocks the
rest): a round keeps 1.25 tokens on average, where a trained pair keeps 2.5-3.5. Batch 1: prompts
of 128 random tokens, 16 new tokens a generation. Each round the draft proposes K = 4 tokens
greedily, one forward each; the target scores the last accepted token and the 4 proposals in one
forward; the proposals are accepted while they equal the target's argmax, compared on the host
one at a time with ``.item()``; the first that differs is replaced by the target's token (after 4
accepted, the target's next token comes free). Both KV caches grow by ``torch.cat`` in every
layer at every forward, and are cut back (a view) to what was accepted. The output is what plain
greedy decoding of the target gives, token for token.

Each call is one generation: an NVTX range ``generate`` holding ``prefill`` and one ``round``
per round (``draft``, ``verify``, ``accept``).

Defect (if any): a host-bound loop: every round five forwards of a few hundred small kernels in
all (the target's ~220 MB of weights read once a round, a fraction of a millisecond of the
GPU's), a wait for the GPU before each proposal compared (up to K a round), the caches copied
into new tensors at every forward.

    python w_speculative_decode_infer.py [--steps 40] [--fix accept_on_gpu] [--fix static_cache]
        [--fix draft_k8] [--fix compile]

Fixes:
  accept_on_gpu  the accepted count computed on the GPU (the matches' cumulative product,
                 summed) and read once a round.
  static_cache   each model's caches allocated once ([layers, 1, heads, 152, 64], K and V) and
                 written in place at the next positions; attention reads the filled prefix (a
                 view); cutting back is setting the length.
  draft_k8       8 proposals a round instead of 4: more tokens a round where the draft agrees
                 long, more draft forwards and a longer verification where it does not.
  compile        the target and the draft under ``torch.compile`` (default mode; the caches'
                 lengths and the tokens a forward change from call to call).
"""
from __future__ import annotations

import itertools
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("accept_on_gpu", "static_cache", "draft_k8", "compile")
CUDA_ONLY: tuple[str, ...] = ()
MAX_K = 8         # the most proposals a round of any variant (the caches' and positions' room)


class CatCache:
    """Per layer K and V, extended with ``torch.cat`` at each forward; ``len`` positions filled."""

    def __init__(self, layers: int) -> None:
        self.k: list[Optional[torch.Tensor]] = [None] * layers
        self.v: list[Optional[torch.Tensor]] = [None] * layers
        self.len = 0

    def reset(self) -> None:
        self.k, self.v, self.len = [None] * len(self.k), [None] * len(self.v), 0

    def update(self, i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k[i] is not None:
            k, v = torch.cat([self.k[i], k], dim=2), torch.cat([self.v[i], v], dim=2)
        self.k[i], self.v[i] = k, v
        return k, v

    def crop(self, n: int) -> None:
        """Keep the first ``n`` positions (rejected proposals dropped)."""
        self.k = [t[:, :, :n] for t in self.k]
        self.v = [t[:, :, :n] for t in self.v]
        self.len = n


class StaticCache(CatCache):
    """Buffers [layers, 1, heads, max_len, head_dim] allocated once, written in place."""

    def __init__(self, layers: int, heads: int, max_len: int, head_dim: int, dev: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__(layers)
        self.kb = torch.zeros(layers, 1, heads, max_len, head_dim, device=dev, dtype=dtype)
        self.vb = torch.zeros_like(self.kb)

    def reset(self) -> None:
        self.len = 0

    def update(self, i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.len + k.shape[2]
        self.kb[i, :, :, self.len:end] = k
        self.vb[i, :, :, self.len:end] = v
        return self.kb[i, :, :, :end], self.vb[i, :, :, :end]

    def crop(self, n: int) -> None:
        self.len = n


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor, cache: CatCache, i: int, mask: Optional[torch.Tensor]) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        k, v = cache.update(i, k, v)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Decoder(nn.Module):
    """A GPT decoder; ``shared``: a decoder whose embeddings, final norm and head it uses (a draft)."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, max_len: int,
                 shared: Optional["Decoder"] = None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        if shared is None:
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        else:
            self.tok, self.pos, self.ln, self.head = shared.tok, shared.pos, shared.ln, shared.head

    def forward(self, ids: torch.Tensor, cache: CatCache, n_out: int = 1) -> torch.Tensor:
        """Logits of the last ``n_out`` positions of ``ids``, which the cache then holds."""
        s, start = ids.shape[1], cache.len
        pos = torch.arange(start, start + s, device=ids.device)
        # causal over the cache and the new positions (SDPA's is_causal aligns a block of queries
        # to the keys' start, not their end)
        mask = None if s == 1 else torch.arange(start + s, device=ids.device)[None, :] <= pos[:, None]
        x = self.tok(ids) + self.pos(pos)
        for i, blk in enumerate(self.blocks):
            x = blk(x, cache, i, mask)
        cache.len += s
        return self.head(self.ln(x[:, -n_out:]))


def accepted(drafts: torch.Tensor, preds: torch.Tensor, on_gpu: bool) -> int:
    """How many of the proposals ``drafts`` [1, K] agree with the target's argmax ``preds``
    [1, K+1] before the first that does not."""
    k = drafts.shape[1]
    if on_gpu:
        return int((drafts == preds[:, :k]).long().cumprod(1).sum().item())
    n = 0
    for j in range(k):
        if not (drafts[0, j] == preds[0, j]).item():    # a wait for the GPU per proposal
            break
        n += 1
    return n


class Speculator:
    """Greedy speculative generation from ``target`` with ``draft`` proposing ``k`` tokens a round."""

    def __init__(self, target: nn.Module, draft: nn.Module, tcache: CatCache, dcache: CatCache,
                 k: int, on_gpu: bool) -> None:
        self.target, self.draft, self.tc, self.dc, self.k, self.on_gpu = target, draft, tcache, dcache, k, on_gpu
        self.rounds = self.proposed = self.kept = 0

    @torch.inference_mode()
    def generate(self, prompt: torch.Tensor, new: int) -> torch.Tensor:
        p = prompt.shape[1]
        with nvtx("prefill"):
            self.tc.reset()
            self.dc.reset()
            seq = torch.cat([prompt, self.target(prompt, self.tc).argmax(-1)], 1)
            self.draft(prompt, self.dc)
        # the target's cache holds every token but the last; the draft's may lag one behind that
        while seq.shape[1] - p < new:
            with nvtx("round"):
                with nvtx("draft"):
                    ids, props = seq[:, self.dc.len:], []
                    for _ in range(self.k):
                        ids = self.draft(ids, self.dc).argmax(-1)
                        props.append(ids)
                    drafts = torch.cat(props, 1)
                with nvtx("verify"):
                    preds = self.target(torch.cat([seq[:, -1:], drafts], 1), self.tc, self.k + 1).argmax(-1)
                with nvtx("accept"):
                    a = accepted(drafts, preds, self.on_gpu)
                    seq = torch.cat([seq, drafts[:, :a], preds[:, a:a + 1]], 1)
                    self.tc.crop(seq.shape[1] - 1)
                    self.dc.crop(min(self.dc.len, seq.shape[1] - 1))
            self.rounds, self.proposed, self.kept = self.rounds + 1, self.proposed + self.k, self.kept + a
        return seq[:, p:p + new]


@torch.inference_mode()
def greedy(model: nn.Module, cache: CatCache, prompt: torch.Tensor, new: int) -> torch.Tensor:
    """Plain greedy decoding, a token a forward: what speculative decoding must reproduce."""
    cache.reset()
    tok = model(prompt, cache).argmax(-1)
    out = [tok]
    for _ in range(new - 1):
        tok = model(tok, cache).argmax(-1)
        out.append(tok)
    return torch.cat(out, 1)


def make_cache(static: bool, model: Decoder, heads: int, max_len: int, dev: torch.device,
               dtype: torch.dtype) -> CatCache:
    layers, d = len(model.blocks), model.tok.embedding_dim
    return StaticCache(layers, heads, max_len, d // heads, dev, dtype) if static else CatCache(layers)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The target, the draft and their caches with ``fixes`` applied; returns one generation (the
    next prompt of the pool; its new tokens)."""
    vocab, d, heads, layers, draft_layers, prompt, new = 32000, 768, 12, 12, 2, 128, 16
    if args.small:
        vocab, d, heads, layers, draft_layers, prompt, new = 97, 32, 4, 2, 1, 8, 12
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    max_len = prompt + new + MAX_K
    torch.manual_seed(0)
    target = Decoder(vocab, d, heads, layers, max_len)
    draft = Decoder(vocab, d, heads, draft_layers, max_len, shared=target)
    target, draft = target.to(dev, dtype).eval(), draft.to(dev, dtype).eval()
    static = "static_cache" in fixes
    spec = Speculator(torch.compile(target) if "compile" in fixes else target,
                      torch.compile(draft) if "compile" in fixes else draft,
                      make_cache(static, target, heads, max_len, dev, dtype),
                      make_cache(static, draft, heads, max_len, dev, dtype),
                      8 if "draft_k8" in fixes else 4, "accept_on_gpu" in fixes)
    gen = torch.Generator(device=dev).manual_seed(1)
    prompts = itertools.cycle([torch.randint(0, vocab, (1, prompt), device=dev, generator=gen) for _ in range(4)])

    def step() -> torch.Tensor:
        with nvtx("generate"):
            return spec.generate(next(prompts), new)
    step.spec = spec
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=40,
                                    steps_help="generations of 16 tokens (the first ones are warm-up)",
                                    small_help="tiny models and prompts, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        spec = ran[0].spec
        print(f"w_speculative_decode_infer: {args.steps} generations, fixes {sorted(fixes) or 'none'}, "
              f"{spec.rounds} rounds, {spec.kept}/{spec.proposed} proposals accepted")


if __name__ == "__main__":
    main()
