"""Beam search from a hand-written decoder-only LM (the KV-cache decoder of
w_kv_decode_sampling.py at 6 layers, hidden 512, 8 heads, vocabulary 8000; bf16 weights,
random), as translation code written before batched generate APIs does it: 8 prompts of 32
tokens, 4 beams each, 48 new tokens. Each step takes the 2 x 4 best continuations of each
sentence's beams (log-softmax plus the beams' scores, ``topk`` over beams x vocabulary), reads
them back with ``.tolist()`` and walks them in Python: a candidate ending in EOS becomes a
finished hypothesis (its score over its length), the first 4 others are the sentence's new
beams. The beams' tokens live in Python lists; their origins, next tokens and scores go back to
the GPU as new tensors, and every layer's cache is reordered by the origins (``index_select``).
After 48 tokens the best finished or live hypothesis of each sentence is kept and the next 8
prompts start.

Each call is one token: an NVTX range ``beam_step`` holding ``prefill`` (when a new batch
starts), ``forward`` and ``select``.

Defect: the CPU waits for the GPU every token (``.tolist()``) and then walks 64 candidates in
Python and builds three tensors from lists (three pageable copies to the GPU) before the next
forward can start; the GPU's work a token is a fraction of a millisecond.

    python w_beam_search_decode.py [--steps 300] [--fix gpu_beams] [--fix compile]

Fixes:
  gpu_beams  the candidates selected on the GPU (EOS candidates masked, the first 4 others taken
             by a second ``topk``, finished hypotheses' best score kept per sentence), the beams'
             tokens kept in a GPU tensor reordered with the cache: nothing read back until a
             search ends.
  compile    the LM under ``torch.compile`` (the cache grows a position each token).
"""
from __future__ import annotations

import itertools
from typing import Callable

import torch
import torch.nn.functional as F

from _corpus import nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)
from w_kv_decode_sampling import LM, CatCache  # noqa: E402 (the decoder, shared)

FIXES = ("gpu_beams", "compile")
CUDA_ONLY: tuple[str, ...] = ()
EOS, BEAMS = 2, 4


def host_select(scores: torch.Tensor, idx: torch.Tensor, vocab: int, lengths: int,
                finished: list[list[tuple[float, int, int]]]) -> tuple[list[int], list[int], list[float]]:
    """The Python walk over each sentence's 2 x BEAMS best candidates (``scores``/``idx``:
    [B, 2K], best first): EOS candidates become finished hypotheses (score over ``lengths``,
    with the beam and the step they end), the first BEAMS others the new beams. Returns their
    origins (rows of the previous beams), tokens and scores, sentence by sentence."""
    s_l, i_l = scores.tolist(), idx.tolist()       # a wait for the GPU
    origins, tokens, new_scores = [], [], []
    for b, (ss, ii) in enumerate(zip(s_l, i_l)):
        kept = 0
        for s, i in zip(ss, ii):
            beam, tok = divmod(i, vocab)
            if tok == EOS:
                finished[b].append((s / lengths, b * BEAMS + beam, lengths))
                continue
            origins.append(b * BEAMS + beam)
            tokens.append(tok)
            new_scores.append(s)
            kept += 1
            if kept == BEAMS:
                break
    return origins, tokens, new_scores


def gpu_select(scores: torch.Tensor, idx: torch.Tensor, vocab: int, lengths: int,
               best_done: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """host_select on the GPU: an EOS candidate counts where fewer than BEAMS others rank above
    it (where the walk would have reached it); ``best_done`` [B] keeps each sentence's best
    finished score (over ``lengths``). Returns origins, tokens and scores as tensors [B*K]."""
    b = scores.shape[0]
    beam, tok = idx // vocab, idx % vocab
    eos = tok == EOS
    others_before = torch.cumsum(~eos, 1) - (~eos).long()
    reached = eos & (others_before < BEAMS)
    best_done.copy_(torch.maximum(best_done, torch.where(reached, scores / lengths, -torch.inf).amax(1)))
    # the first BEAMS non-EOS candidates, in rank order
    rank = torch.where(eos, torch.inf, torch.arange(idx.shape[1], device=idx.device, dtype=scores.dtype))
    pick = torch.topk(rank, BEAMS, dim=1, largest=False).indices
    base = torch.arange(b, device=idx.device)[:, None] * BEAMS
    return ((base + beam.gather(1, pick)).reshape(-1), tok.gather(1, pick).reshape(-1),
            scores.gather(1, pick).reshape(-1))


def reorder(cache: CatCache, origins: torch.Tensor) -> None:
    for i in range(len(cache.k)):
        cache.k[i], cache.v[i] = cache.k[i].index_select(0, origins), cache.v[i].index_select(0, origins)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model, cache and prompt pool with ``fixes`` applied; returns one beam-search step (a
    new batch prefilled first when the last search ended); the best scores of the last search
    ended (zeros before the first)."""
    vocab, d, heads, layers, batch, prompt, max_new = 8000, 512, 8, 6, 8, 32, 48
    if args.small:
        vocab, d, heads, layers, batch, prompt, max_new = 12, 16, 2, 1, 2, 3, 6
    torch.manual_seed(0)
    model = LM(vocab, d, heads, layers, prompt + max_new).to(dev, torch.bfloat16).eval()
    fwd = torch.compile(model) if "compile" in fixes else model
    cache = CatCache(layers, prompt + max_new, dev)
    gen = torch.Generator(device=dev).manual_seed(1)
    prompts = itertools.cycle([torch.randint(3, vocab, (batch, prompt), device=dev, generator=gen)
                               for _ in range(3)])
    on_gpu = "gpu_beams" in fixes
    st: dict = {"n": max_new, "best": torch.zeros(batch, device=dev)}

    def finish() -> None:
        """Each sentence's best hypothesis: finished or live (live ones over their length)."""
        live = st["scores"].view(batch, BEAMS).amax(1) / max_new
        if on_gpu:
            st["best"] = torch.maximum(st["done"], live)
        else:
            done = torch.tensor([max((h[0] for h in f), default=-float("inf")) for f in st["done"]], device=dev)
            st["best"] = torch.maximum(done, live)

    @torch.inference_mode()
    def step() -> torch.Tensor:
        with nvtx("beam_step"):
            if st["n"] >= max_new:
                if "scores" in st:
                    finish()
                with nvtx("prefill"):
                    cache.reset()
                    ids = next(prompts).repeat_interleave(BEAMS, 0)
                    logits = fwd(ids, cache)
                    # only the first beam of each sentence starts (the others are copies)
                    st["scores"] = torch.tensor([0.0] + [-1e9] * (BEAMS - 1), device=dev).repeat(batch)
                    st["done"] = torch.full((batch,), -torch.inf, device=dev) if on_gpu else [[] for _ in range(batch)]
                    st["seqs"] = ids if on_gpu else ids.tolist()
                    st["n"] = 0
            else:
                with nvtx("forward"):
                    logits = fwd(st["tok"][:, None], cache)
            with nvtx("select"):
                cand = (st["scores"][:, None] + F.log_softmax(logits.float(), -1)).view(batch, BEAMS * vocab)
                scores, idx = torch.topk(cand, 2 * BEAMS, dim=1)
                length = st["n"] + 1
                if on_gpu:
                    origins, tok, st["scores"] = gpu_select(scores, idx, vocab, length, st["done"])
                    st["seqs"] = torch.cat([st["seqs"].index_select(0, origins), tok[:, None]], 1)
                else:
                    o, t, s = host_select(scores, idx, vocab, length, st["done"])
                    st["seqs"] = [st["seqs"][i] + [k] for i, k in zip(o, t)]
                    origins, tok = torch.tensor(o, device=dev), torch.tensor(t, device=dev)
                    st["scores"] = torch.tensor(s, device=dev)
                reorder(cache, origins)
                st["tok"], st["n"] = tok, length
        return st["best"]
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=300,
                                    steps_help="tokens (searches of 48 follow one another)")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_beam_search_decode: {args.steps} tokens, fixes {sorted(fixes) or 'none'}, "
              f"last best scores {ran[1][-1].float().mean().item():.4f}")


if __name__ == "__main__":
    main()
