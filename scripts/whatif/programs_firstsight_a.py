"""First-sight programs for the what-if corpus, set A: ten programs of kinds the corpus lacked
(a recommender, a mixture of experts, sampling with a KV cache, hand-written attention, a
host-side evaluation loop, a per-sample loss, gradient accumulation in fp16, gradient
checkpointing, CPU tokenisation, and a step with little left to gain), in the format of
``PROGRAMS`` in ``scripts/whatif/registry.py``.

``expect`` holds the expectation written with the programs, before any of them ran on an H200:
iteration times are estimates from their FLOPs, bytes and launch counts, not measurements.

Imports nothing beyond the standard library."""
from __future__ import annotations

W = "scripts/workloads"

PROGRAMS: list[dict] = [
    {
        "name": "recsys_embbag_train", "family": "recommendation: EmbeddingBag tables, Adam", "script": f"{W}/w_recsys_embbag_train.py", "args": [],
        "interleave": "all",
        "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "fused_adam": {"args": ["--fix", "fused_adam"], "pays": True,
                           "what": "Adam(fused=True) instead of the default foreach (dense table gradients kept)"},
            "sparse": {"args": ["--fix", "sparse"], "pays": True,
                       "what": "EmbeddingBag(sparse=True) tables updated by SparseAdam, Adam for the MLPs"},
            "bf16": {"args": ["--fix", "bf16"], "pays": False,
                     "what": "MLPs and interaction under torch.autocast(bfloat16); tables and optimizer unchanged"},
        },
        "expect": {
            "baseline": "DLRM, 8 EmbeddingBag tables of 7.8M rows x 64 (500M params), batch 8192: dense 2 GB "
                        "table gradients and foreach Adam's ~10 passes over 500M floats (~36 GB of traffic) "
                        "make the step; the MLPs are a small part. GPU-bound, estimate 11-16 ms",
            "fused_adam": "pays: one pass (~14 GB) instead of ~10; estimate 1.6-2.2x",
            "sparse": "pays most: only the ~700k rows looked up (of 7.8M) are touched (SparseAdam coalesces "
                      "each gradient, a few syncs), the MLPs' 2.6M params by Adam; estimate 3-6x",
            "bf16": "no gain: the MLPs are a fraction of a ms at batch 8192; estimate 0.97-1.03x",
        },
    },
    {
        "name": "moe_routing_train", "family": "mixture of experts: nonzero routing", "script": f"{W}/w_moe_routing_train.py", "args": [],
        "interleave": "all",
        "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "capacity": {"args": ["--fix", "capacity"], "pays": True,
                         "what": "fixed expert capacity (1.25x), tokens scattered into a padded [16, C, 1024] "
                                 "buffer, experts as two baddbmm: no nonzero, no sync, static shapes"},
            "compile": {"args": ["--fix", "compile"], "pays": None, "compiles": True,
                        "what": "torch.compile(model), default mode; the nonzero routing loop runs eagerly"},
            "fused_adamw": {"args": ["--fix", "fused_adamw"], "pays": True,
                            "what": "AdamW(fused=True) instead of the default foreach"},
        },
        "expect": {
            "baseline": "4-layer top-2 MoE LM, 16 experts, 8x1024 tokens, bf16 autocast, 290M params: 64 "
                        "nonzero syncs in the forward, each followed by a dozen small launches from an empty "
                        "queue; ~4 TFLOP of GPU work and a 290M-param foreach AdamW. Estimate 25-35 ms",
            "capacity": "pays: the forward no longer waits, far fewer launches; up to 25% more expert FLOPs in "
                        "the padding. Estimate 1.3-1.8x",
            "compile": "unsure: attention and norms fused and each expert's MLP compiled with dynamic shapes, "
                       "but the 64 syncs and the loop stay eager; compilation ~1 min",
            "fused_adamw": "pays a little: ~21 GB of foreach traffic down to ~8 GB, on the critical path after "
                           "the sync-bound forward. Estimate 1.08-1.15x",
        },
    },
    {
        "name": "kv_decode_sampling", "family": "KV-cache decode with sampling and stopping", "script": f"{W}/w_kv_decode_sampling.py", "args": [],
        "interleave": "all",
        "capture_args": ["--steps", "60"],
        "step_range": "decode", "kind": "decode",
        "fixes": {
            "prealloc": {"args": ["--fix", "prealloc"], "pays": False,
                         "what": "static preallocated KV cache written in place instead of torch.cat every token"},
            "check_every_16": {"args": ["--fix", "check_every_16"], "pays": False,
                               "what": "stopping criteria read with .item() every 16 tokens instead of every token"},
            "graph": {"args": ["--fix", "graph"], "pays": True,
                      "what": "static cache, position on the GPU, the decode step with top-k/top-p sampling "
                              "captured in one CUDA graph; the per-token stop check kept"},
        },
        "expect": {
            "baseline": "24-layer d=1024 decoder, bf16, batch 4, 256 new tokens after a 128-token prompt: ~400 "
                        "launches a token for ~0.3 ms of GPU work, torch.cat cache, 3 syncs a token (the stop "
                        "check and two inside torch.multinomial). Host-bound, estimate 3-5 ms a token; one "
                        "period in 256 holds a prefill",
            "prealloc": "no gain: an in-place slice copy replaces each cat, the same launch count; the copies "
                        "saved are a few MB a token. Estimate 1.0-1.05x",
            "check_every_16": "no gain: multinomial's own two .item() still wait every token, and in a "
                              "host-bound loop a wait costs only the queue's short tail. Estimate 1.0-1.03x",
            "graph": "pays: one launch a token; the GPU then runs the ~400 small kernels back to back. "
                     "Estimate 2.5-4x",
        },
    },
    {
        "name": "handwritten_attention_train", "family": "hand-written attention", "script": f"{W}/w_handwritten_attention_train.py", "args": [],
        "interleave": "all",
        "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "sdpa": {"args": ["--fix", "sdpa"], "pays": True,
                     "what": "F.scaled_dot_product_attention(is_causal=True, dropout_p=0.1) instead of the "
                             "written-out attention"},
            "compile": {"args": ["--fix", "compile"], "pays": True, "compiles": True,
                        "what": "torch.compile(model), default mode; the attention code unchanged"},
            "fused_adamw": {"args": ["--fix", "fused_adamw"], "pays": False,
                            "what": "AdamW(fused=True) instead of the default foreach"},
        },
        "expect": {
            "baseline": "GPT-2 small at 2 x 2048 tokens, bf16 autocast, attention written out (scores, "
                        "masked_fill, fp32 softmax, dropout, @V): several GB of memory traffic a layer around "
                        "~4 TFLOP of GEMMs. GPU-bound, estimate 30-45 ms",
            "sdpa": "pays: FlashAttention, the score matrix never materialised. Estimate 2.5-3.5x",
            "compile": "pays: mask, softmax and dropout fused (or the pattern replaced by fused attention). "
                       "Estimate 1.5-3x",
            "fused_adamw": "small: 124M params, ~1.5 ms of a ~40 ms step. Estimate 1.02-1.05x",
        },
    },
    {
        "name": "eval_metrics_host", "family": "evaluation with host-side metrics", "script": f"{W}/w_eval_metrics_host.py", "args": [],
        "interleave": "all",
        "capture_args": ["--steps", "40"],
        "step_range": "eval_batch", "kind": "inference",
        "fixes": {
            "argmax_gpu": {"args": ["--fix", "argmax_gpu"], "pays": True,
                           "what": "top-5 on the GPU, only [128, 5] ids copied back"},
            "pinned": {"args": ["--fix", "pinned"], "pays": True,
                       "what": "logits copied into two pinned buffers with non_blocking=True, their metrics "
                               "computed one batch later, overlapping the next forward"},
            "metrics_gpu": {"args": ["--fix", "metrics_gpu"], "pays": True,
                            "what": "hits and per-class counts accumulated on the GPU, read once at the end"},
        },
        "expect": {
            "baseline": "ViT-B/16 bf16, batch 128, 21,843 classes: ~10 ms of forward, then an 11 MB pageable "
                        "copy and ~20-30 ms of numpy (argpartition over 2.8M scores for the top 5) with the "
                        "GPU idle. Estimate 30-45 ms",
            "argmax_gpu": "pays: the host work shrinks to a few small arrays; GPU-bound after. Estimate 2.5-4x",
            "pinned": "pays: the numpy work overlaps the next forward, the step becomes the longer of the two "
                      "(the host's). Estimate 1.2-1.5x",
            "metrics_gpu": "pays most: nothing read back per batch. Estimate 3-4x",
        },
    },
    {
        "name": "per_sample_loss_train", "family": "a Python loop over samples in the loss", "script": f"{W}/w_per_sample_loss_train.py", "args": [],
        "interleave": "all",
        "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "vectorized": {"args": ["--fix", "vectorized"], "pays": True,
                           "what": "the batch-hard triplet loss over the whole batch in tensor ops"},
            "graph": {"args": ["--fix", "graph"], "pays": True,
                      "what": "loop kept; forward, loss, backward and AdamW(capturable=True) captured in one "
                              "CUDA graph"},
            "compile": {"args": ["--fix", "compile"], "pays": True, "compiles": True,
                        "what": "loop kept, the loss function under torch.compile (default mode)"},
        },
        "expect": {
            "baseline": "re-id ViT-S/16, batch 64 (16 ids x 4), bf16 autocast; the triplet loss loops over 64 "
                        "anchors: ~1,700 tiny kernels forward and backward besides ~4 ms of ViT work. "
                        "Host-bound, estimate 18-28 ms",
            "vectorized": "pays: a dozen kernels for the loss; the eager ViT's launches remain. Estimate 2.5-4x",
            "graph": "pays: one launch a step; the GPU runs the tiny kernels back to back (~2 us each). "
                     "Estimate 2-3.5x",
            "compile": "pays: the unrolled loop fused into a few kernels, forward and backward; ViT eager. "
                       "Estimate 2-3.5x; compilation of the 64-way unrolled loss takes a while",
        },
    },
    {
        "name": "grad_accum_fp16_train", "family": "gradient accumulation, fp16 with GradScaler", "script": f"{W}/w_grad_accum_fp16_train.py", "args": [],
        "interleave": "all",
        # a step of 0.3 s: five variants' 9 rounds ran past 118 s on the H200; 5 rounds take about 130 s
        "rounds": 5,
        "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "bf16": {"args": ["--fix", "bf16"], "pays": None,
                     "what": "bf16 autocast, GradScaler disabled (no unscale pass, no inf-check sync)"},
            "bigger_micro": {"args": ["--fix", "bigger_micro"], "pays": True,
                             "what": "2 micro-batches of 8 x 1024 instead of 8 of 2 x 1024 (same tokens a step)"},
            "no_item": {"args": ["--fix", "no_item"], "pays": None,
                        "what": "micro-batch losses summed on the GPU, read once per step"},
            "fused_adamw": {"args": ["--fix", "fused_adamw"], "pays": None,
                            "what": "AdamW(fused=True); GradScaler then passes the inf flag without a sync"},
        },
        "expect": {
            "baseline": "HF GPT-2 small, fp16 autocast + GradScaler, 8 micro-batches of 2 x 1024 a step, "
                        "loss.item() per micro-batch, clip_grad_norm_, foreach AdamW: each micro-batch ~4-5 ms "
                        "of GPU work for about as much launching. Estimate 40-60 ms a step",
            "bf16": "unsure, small: same tensor-core speed; the unscale pass and one sync a step go. "
                    "Estimate 1.02-1.08x",
            "bigger_micro": "pays: a quarter of the launches and larger GEMMs; GPU-bound after. Estimate 1.2-1.5x",
            "no_item": "unsure, small: 8 syncs a step become 1, but in a host-paced loop each wait is short. "
                       "Estimate 1.0-1.08x",
            "fused_adamw": "unsure, small: ~2 ms of foreach passes and the scaler's sync go. Estimate 1.03-1.08x",
        },
    },
    {
        "name": "grad_checkpoint_train", "family": "gradient checkpointing", "script": f"{W}/w_grad_checkpoint_train.py", "args": [],
        "interleave": "all",
        "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "no_checkpointing": {"args": ["--fix", "no_checkpointing"], "pays": True,
                                 "what": "gradient checkpointing left off (memory allows it)"},
            "fused_adamw": {"args": ["--fix", "fused_adamw"], "pays": True,
                            "what": "AdamW(fused=True) instead of the default foreach"},
            # timed after the first sight: PK402's top action there (torch.compile around the chains)
            "compile": {"args": ["--fix", "compile"], "pays": None, "compiles": True,
                        "what": "torch.compile(model), default mode, checkpointing kept"},
        },
        "expect": {
            "baseline": "HF Llama 270M (16 layers, 1024 wide), bf16 autocast, 8 x 1024 tokens, gradient "
                        "checkpointing (non-reentrant): each layer's forward recomputed in the backward. "
                        "GPU-bound, estimate 40-55 ms",
            "no_checkpointing": "pays: the recomputed forward (~a quarter of the step's work) goes. "
                                "Estimate 1.2-1.3x",
            "fused_adamw": "pays a little: 270M params, ~5 ms of foreach passes down to ~2. Estimate 1.05-1.1x",
            "compile": "PK402's top action at first sight (1.55x), never timed then",
        },
    },
    {
        "name": "cpu_tokenize_infer", "family": "CPU tokenisation in the loop", "script": f"{W}/w_cpu_tokenize_infer.py", "args": [],
        "interleave": ["encode_batch", "pretokenized"],
        "capture_args": ["--steps", "40"],
        "step_range": "infer", "kind": "data",
        "fixes": {
            "encode_batch": {"args": ["--fix", "encode_batch"], "pays": True,
                             "what": "tokenizer.encode_batch with the tokenizer's own padding, instead of a "
                                     "Python loop of encode"},
            "workers": {"args": ["--fix", "workers"], "pays": True,
                        "what": "the same encode loop in a DataLoader with 4 workers, tokenising ahead"},
            "pretokenized": {"args": ["--fix", "pretokenized"], "pays": True,
                             "what": "requests tokenised once at start-up: the upper bound"},
        },
        "expect": {
            "baseline": "BERT-base bf16 on 64 x 128 tokens (~4 ms of GPU) after a Python loop of "
                        "tokenizer.encode over 64 documents (~6k words) on the main thread; .tolist() of the "
                        "results waits for the forward. CPU and GPU take turns; estimate 15-30 ms",
            "encode_batch": "pays: the tokenizer's Rust threads on 16 cores. Estimate 2-4x",
            "workers": "pays: tokenisation ahead of the GPU in 4 processes; steady state after the prefetch "
                       "buffer. Estimate 2-4x",
            "pretokenized": "pays most: copy and forward only. Estimate 3-5x",
        },
    },
    {
        "name": "tuned_gpt_train", "family": "already tuned: compiled, bf16, SDPA, fused", "script": f"{W}/w_tuned_gpt_train.py", "args": [],
        "interleave": ["reduce_overhead", "tf32"],
        "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training", "compiles": True,  # the baseline too
        "fixes": {
            "reduce_overhead": {"args": ["--fix", "reduce_overhead"], "pays": False,
                                "what": "torch.compile(mode='reduce-overhead'): CUDA graphs over the compiled "
                                        "forward and backward"},
            "tf32": {"args": ["--fix", "tf32"], "pays": False,
                     "what": "torch.set_float32_matmul_precision('high') (under bf16 autocast)"},
            "expandable_segments": {"args": ["--fix", "expandable_segments"], "pays": False,
                                    "what": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"},
        },
        "expect": {
            "baseline": "HF Llama 220M, compiled (default mode), bf16 autocast, SDPA, fused AdamW, no syncs, "
                        "sizes multiples of 64, 8 x 1024 tokens: ~12 TFLOP, GPU-bound. Estimate 20-30 ms; "
                        "compiles in its warm-up steps",
            "reduce_overhead": "no gain: the CPU is already ahead of the GPU. Estimate 0.98-1.03x",
            "tf32": "no gain: no fp32 matrix product left under autocast. Estimate 0.99-1.01x",
            "expandable_segments": "no gain: the step's allocations come from the cache after warm-up. "
                                   "Estimate 0.98-1.02x",
        },
    },
]
