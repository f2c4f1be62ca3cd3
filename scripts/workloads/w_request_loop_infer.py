"""A text-classification service that answers its requests one at a time: a DistilBERT-shaped
encoder (6 post-LayerNorm layers of hidden 768, 12 heads, FFN 3072; the encoder of
w_padded_encoder_infer.py), random weights cast to bf16, under ``torch.inference_mode()``.

Each iteration serves the 32 requests waiting in the queue: texts whose token counts follow a
long-tailed distribution (lognormal, mean about 60 tokens, clipped to 8-256), drawn from a seeded
generator so that every variant sees the same lengths in the same order. Per request, as a
simple handler does: the tokenizer's ids made on the host, copied to the GPU, the encoder and
head run on that one text, and the predicted class read back (``int(logits.argmax())``) for the
response.

Each iteration is an NVTX range ``serve`` holding one ``request`` range per request.

Defect: each request runs the whole model at batch 1 on a few dozen tokens: about 100 kernel
launches of microseconds each and one wait for the GPU, 32 times an iteration, where one
batch of the 32 texts would run the same work in one pass of far larger, fuller kernels.

    python w_request_loop_infer.py [--steps 40] [--fix batched] [--fix no_item] [--fix compile]

Fixes:
  batched  the 32 waiting requests served as one batch: padded to the longest (rounded up to a
           multiple of 8) with their attention mask, one forward, the 32 answers read back at once.
  no_item  each request's answer kept on the GPU, the 32 read back together at the end of the
           iteration: no wait per request.
  compile  ``torch.compile(model, dynamic=True)`` (default mode): the norms, GELU and residual
           adds fused, one compiled graph for every length.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from _corpus import nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)
from w_padded_encoder_infer import CLS, PAD, Encoder  # noqa: E402 (BERT's encoder, written once)

FIXES = ("batched", "no_item", "compile")
CUDA_ONLY: tuple[str, ...] = ()
SIGMA = 0.7       # the lognormal's spread: a long tail of long texts


def lengths_stream(queue: int, mean: float, lo: int, hi: int):
    """The waiting requests' token counts, an iteration's queue at a time, from one seeded
    generator (the same in every variant)."""
    rng = np.random.default_rng(1)
    mu = np.log(mean) - SIGMA ** 2 / 2          # the lognormal's mean is ``mean``
    while True:
        yield np.clip(np.round(rng.lognormal(mu, SIGMA, queue)), lo, hi).astype(np.int64)


def tokenize(lens: list[int], vocab: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What a tokenizer returns for texts of ``lens`` tokens padded to ``width``: host tensors
    ``input_ids`` ([CLS], random word ids, [PAD]) and ``attention_mask``."""
    lens_t = torch.tensor(lens)
    mask = (torch.arange(width)[None, :] < lens_t[:, None]).long()
    ids = torch.randint(vocab // 30, vocab, (len(lens), width)).masked_fill(mask == 0, PAD)
    ids[:, 0] = CLS
    return ids, mask


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], list[int]]:
    """The model with ``fixes`` applied and the stream of requests; returns one iteration (the
    32 answers, read back on the host)."""
    vocab, d, heads, layers, ffn, max_len, classes, queue, mean, lo = 30522, 768, 12, 6, 3072, 256, 3, 32, 60, 8
    if args.small:
        vocab, d, heads, layers, ffn, max_len, classes, queue, mean, lo = 1000, 64, 4, 2, 256, 64, 3, 4, 12, 4
    torch.manual_seed(0)
    model = Encoder(vocab, d, heads, layers, ffn, max_len, classes).to(dev).eval()
    if dev.type == "cuda":
        model = model.to(torch.bfloat16)
    net = torch.compile(model, dynamic=True) if "compile" in fixes else model
    lengths = lengths_stream(queue, mean, lo, max_len)

    def serve_batched(lens: list[int]) -> list[int]:
        with nvtx("request"):
            ids, mask = tokenize(lens, vocab, min(max_len, -(-max(lens) // 8) * 8))
            with torch.inference_mode():
                return net(ids.to(dev), mask.to(dev)).argmax(-1).tolist()

    def serve_each(lens: list[int]) -> list[int]:
        answers = []
        for n in lens:
            with nvtx("request"):
                ids, mask = tokenize([n], vocab, n)
                with torch.inference_mode():
                    pred = net(ids.to(dev), mask.to(dev)).argmax(-1)
                answers.append(pred if "no_item" in fixes else int(pred))   # int(): waits for the GPU
        return torch.cat(answers).tolist() if "no_item" in fixes else answers

    serve = serve_batched if "batched" in fixes else serve_each

    def step() -> list[int]:
        lens = next(lengths).tolist()
        with nvtx("serve"):
            return serve(lens)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=40,
                                    steps_help="iterations of 32 requests (the first ones are warm-up)",
                                    small_help="tiny encoder, short texts and a short queue, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        counts = np.bincount(np.concatenate(ran[1]), minlength=3).tolist()
        print(f"w_request_loop_infer: {args.steps} iterations, fixes {sorted(fixes) or 'none'}, "
              f"answers by class {counts}")


if __name__ == "__main__":
    main()
