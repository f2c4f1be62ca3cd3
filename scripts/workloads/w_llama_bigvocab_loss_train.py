"""Training step of a small LLM with a large vocabulary, whose loss upcasts the logits to
float32: HF ``LlamaForCausalLM`` from a ``LlamaConfig`` (vocabulary 128,256 as Llama 3's, 2
layers, hidden 1024, 16 heads and 8 key-value heads, SwiGLU MLP of 2816, untied embeddings;
random weights, 286M parameters, 262M of them the embedding and the LM head; SDPA attention),
fp32 parameters under bf16 autocast, batch 4 x 1024 random token ids made on the GPU,
``model(input_ids=ids, labels=ids).loss`` (HF's ``ForCausalLMLoss``: ``logits.float()``, then
the shifted mean cross entropy), AdamW (PyTorch's default: foreach).

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect (if any): the logits are the step's largest tensor, 4,096 tokens x 128,256 (1.05 GB in
bf16): the loss copies them to float32 (2.1 GB) and runs its log-softmax forward and backward
over that copy, about 20 GB of HBM traffic a step beside GEMMs of about 4 TFLOP; and the
foreach AdamW's passes over 286M fp32 parameters and their states.

    python w_llama_bigvocab_loss_train.py [--steps 30] [--fix bf16_loss | --fix chunked_loss]
        [--fix compile] [--fix fused_adamw]

Fixes:
  bf16_loss     the logits of ``model(input_ids=ids)`` (bf16) and the shifted cross entropy
                computed by the program outside autocast on them (``causal_lm_loss``): no
                float32 copy, the log-softmax in bf16.
  chunked_loss  the final hidden states from ``model.model(...)``, then the LM head and the cross
                entropy over chunks of 1,024 tokens, each chunk's logits upcast to float32, the
                sums over the chunks divided by the token count (``chunked_lm_loss``): the same
                loss, its float32 copies made a quarter at a time (the log-softmax outputs its
                backward keeps are all kept, as before).
  compile       ``torch.compile(model)`` (default mode; the loss is inside the model's forward).
  fused_adamw   ``AdamW(fused=True)``.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("bf16_loss", "chunked_loss", "compile", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()
IGNORE = -100   # HF's ignore_index: the label of the last position, which predicts nothing
CHUNK = 1024    # tokens a chunk of chunked_loss


def shifted_labels(ids: torch.Tensor) -> torch.Tensor:
    """Each position's label: the next token, ``IGNORE`` at the last position (HF shifts the
    labels, padding them, rather than slicing the logits)."""
    return F.pad(ids[:, 1:], (0, 1), value=IGNORE)


def causal_lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """HF's shifted mean cross entropy on ``logits`` (batch x tokens x vocabulary) as they are:
    no upcast (bf16 logits give a bf16 log-softmax, accumulated in float32 inside the kernels)."""
    return F.cross_entropy(logits.flatten(0, 1), shifted_labels(ids).flatten(), ignore_index=IGNORE)


def chunked_lm_loss(hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor,
                    chunk: int) -> torch.Tensor:
    """The same loss from the final hidden states (batch x tokens x hidden) and the LM head,
    ``chunk`` tokens at a time: each chunk's logits computed and upcast (to float32 at least:
    float64 ones, as the tests give, stay float64), their summed cross entropy added up, divided
    by the count of labelled tokens (HF's mean)."""
    h, labels = hidden.flatten(0, 1), shifted_labels(ids).flatten()
    sums = []
    for i in range(0, h.shape[0], chunk):
        logits = head(h[i:i + chunk])
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        sums.append(F.cross_entropy(logits, labels[i:i + chunk], ignore_index=IGNORE, reduction="sum"))
    return torch.stack(sums).sum() / labels.ne(IGNORE).sum()


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and optimizer with ``fixes`` applied; returns one training step (fresh token
    ids; the step's loss)."""
    # imported here: the loss functions above are checked where transformers is not installed
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=128256, hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
                      num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=2048,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    batch, seq, chunk = 4, 1024, CHUNK
    if args.small:
        cfg = LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                          tie_word_embeddings=False, attn_implementation="sdpa")
        batch, seq, chunk = 2, 16, 12
    cfg.use_cache = False
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1,
                            fused=True if "fused_adamw" in fixes else None)
    net = torch.compile(model) if "compile" in fixes else model
    amp = bf16_autocast(dev)

    def loss_of(ids: torch.Tensor) -> torch.Tensor:
        if "bf16_loss" in fixes:
            logits = net(input_ids=ids).logits
            with torch.autocast(dev.type, enabled=False):  # on the bf16 logits as they are
                return causal_lm_loss(logits, ids)
        if "chunked_loss" in fixes:
            return chunked_lm_loss(model.model(input_ids=ids).last_hidden_state, model.lm_head, ids, chunk)
        return net(input_ids=ids, labels=ids).loss

    def step() -> torch.Tensor:
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev)
        return train_step(lambda: loss_of(ids), opt, amp)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    alternatives=[("bf16_loss", "chunked_loss")])
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_llama_bigvocab_loss_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()
