"""A text-classification service loop: raw documents arrive in batches of 64, are tokenised on the
main thread, run through a BERT-base encoder (HF ``BertModel`` from ``BertConfig``: 12 layers,
hidden 768, random weights, bf16) and a 20-way classification head, and the top-3 labels with
their scores are turned into Python results.

The tokenizer is an HF ``tokenizers`` WordPiece (BERT's normaliser and pre-tokeniser, [CLS]/[SEP]
template, truncation at 128 tokens) trained at start-up on synthetic text: 5,000 pseudo-words
with Zipf frequencies, no files. The requests are 16 batches of synthetic documents (40 to 160
words each, like reviews or support tickets) served in turn. Per batch the loop encodes each
document with ``tokenizer.encode`` in a Python loop, pads the id lists to 128 by hand, and
builds the tensors with ``torch.tensor(...).to("cuda")``.

Each batch is an NVTX range ``infer`` holding ``tokenize``, ``forward`` and ``postprocess``.

Defect: tokenisation (about 6k words a batch, one document at a time, then 8k ids through
Python lists) runs on the main thread between batches; the GPU idles while it runs, and the
``.tolist()`` of the results makes the CPU wait for the forward before it tokenises the next
batch: CPU and GPU take turns.

    python w_cpu_tokenize_infer.py [--steps 60] [--fix encode_batch | --fix workers | --fix pretokenized]

Fixes:
  encode_batch  the tokenizer pads too (``enable_padding(length=128)``) and one
                ``tokenizer.encode_batch(texts)`` call encodes the batch in Rust on all cores.
  workers       the same Python loop of ``encode`` run in a ``DataLoader`` over the request
                batches with 4 worker processes, tokenising batches ahead of the GPU (not
                interleavable: the workers prefetch in the background).
  pretokenized  the request batches tokenised once at start-up, as tensors on the host: the
                loop only copies and runs the model (the bound that tokenisation fixes approach).
"""
from __future__ import annotations

import itertools
import random
from typing import Callable

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import BertConfig, BertModel

from _corpus import nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("encode_batch", "workers", "pretokenized")
CUDA_ONLY: tuple[str, ...] = ()
MAX_LEN, LABELS = 128, [f"topic_{i}" for i in range(20)]


def synthetic_docs(n: int, words: tuple[int, int], rng: random.Random, vocab: list[str],
                   cum: list[float]) -> list[str]:
    out = []
    for _ in range(n):
        ws = rng.choices(vocab, cum_weights=cum, k=rng.randint(*words))
        for j in range(12, len(ws), rng.randint(10, 20)):  # some sentences
            ws[j] += "."
        out.append(" ".join(ws).capitalize())
    return out


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, show_progress=False,
                                        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok.train_from_iterator(texts, trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.enable_truncation(MAX_LEN)
    return tok


def tokenize_loop(tok: Tokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """One ``encode`` per document, padded by hand: (ids, attention mask) on the host."""
    ids, mask = [], []
    for t in texts:
        enc = tok.encode(t)
        pad = MAX_LEN - len(enc.ids)
        ids.append(enc.ids + [0] * pad)
        mask.append([1] * len(enc.ids) + [0] * pad)
    return torch.tensor(ids), torch.tensor(mask)


class RequestBatches(torch.utils.data.Dataset):
    """The request batches served in turn, tokenised in ``__getitem__`` (DataLoader workers)."""

    def __init__(self, tok: Tokenizer, batches: list[list[str]]) -> None:
        self.tok, self.batches = tok, batches

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return tokenize_loop(self.tok, self.batches[i % len(self.batches)])


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], list]:
    """Tokenizer, model and request batches with ``fixes`` applied; returns one batch's step
    (tokenise, forward, post-process; the batch's results)."""
    n_words, vocab_size, n_train, batch, n_batches, doc_words = 5000, 8192, 2000, 64, 16, (40, 160)
    layers, d, heads = 12, 768, 12
    if args.small:
        n_words, vocab_size, n_train, batch, n_batches, doc_words = 300, 400, 200, 4, 4, (20, 80)
        layers, d, heads = 2, 32, 4
    rng = random.Random(0)
    vocab = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 10))) for _ in range(n_words)]
    cum = list(itertools.accumulate(1.0 / (r + 1) for r in range(n_words)))  # Zipf
    tok = train_tokenizer(synthetic_docs(n_train, doc_words, rng, vocab, cum), vocab_size)
    batches = [synthetic_docs(batch, doc_words, rng, vocab, cum) for _ in range(n_batches)]
    cfg = BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=d, num_hidden_layers=layers,
                     num_attention_heads=heads, intermediate_size=4 * d)
    model = BertModel(cfg).to(dev, torch.bfloat16).eval()
    head = torch.nn.Linear(d, len(LABELS)).to(dev, torch.bfloat16).eval()
    turn = itertools.count()
    if "encode_batch" in fixes:
        tok.enable_padding(length=MAX_LEN, pad_id=0, pad_token="[PAD]")
    if "pretokenized" in fixes:
        ready = [tokenize_loop(tok, b) for b in batches]
    if "workers" in fixes:
        loader = iter(torch.utils.data.DataLoader(RequestBatches(tok, batches), batch_size=None, num_workers=4,
                                                  prefetch_factor=2, persistent_workers=True))

    def tokenize() -> tuple[torch.Tensor, torch.Tensor]:
        i = next(turn) % n_batches
        if "workers" in fixes:
            return next(loader)
        if "pretokenized" in fixes:
            return ready[i]
        if "encode_batch" in fixes:
            encs = tok.encode_batch(batches[i])
            return torch.tensor([e.ids for e in encs]), torch.tensor([e.attention_mask for e in encs])
        return tokenize_loop(tok, batches[i])

    @torch.inference_mode()
    def step() -> list:
        with nvtx("infer"):
            with nvtx("tokenize"):
                ids, mask = tokenize()
                ids, mask = ids.to(dev), mask.to(dev)
            with nvtx("forward"):
                pooled = model(input_ids=ids, attention_mask=mask).pooler_output
                top = head(pooled).float().softmax(-1).topk(3)
            with nvtx("postprocess"):
                scores, labels = top.values.tolist(), top.indices.tolist()  # waits for the forward
                return [{"label": LABELS[lab[0]], "score": round(sc[0], 4),
                         "top3": [(LABELS[x], round(s, 4)) for x, s in zip(lab, sc)]}
                        for lab, sc in zip(labels, scores)]
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=60,
                                    alternatives=[("encode_batch", "workers"), ("encode_batch", "pretokenized"),
                                                  ("workers", "pretokenized")],
                                    steps_help="batches (the first ones are warm-up)")
    ran = run(build, args, fixes, dev,
              not_interleaved={"workers": "tokenises in background worker processes"})
    if ran:
        print(f"w_cpu_tokenize_infer: {args.steps} batches, fixes {sorted(fixes) or 'none'}, "
              f"last batch's first result {ran[1][-1][0]}")


if __name__ == "__main__":
    main()
