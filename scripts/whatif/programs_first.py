"""The corpus's first programs: the eighteen of every kind timed while the step model and the
rules were written (the page's "built on", ``roles.BUILT_ON``). The fields are the registry's
(``registry``).

``LISTED_LAST`` holds two of them that the registry lists after the later models (they were
added before those, which went in above them); the page's tables follow the registry's order, so
they stay last.
"""
from __future__ import annotations

from .builders import W, generate_fixes

PROGRAMS: list[dict] = [
    {
        "name": "train_llama", "script": f"{W}/train_llama.py", "args": ["--steps", "40"],
        "interleave": "all",
        "capture_args": ["--steps", "12"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "fused": {"args": ["--fused"], "pays": True,
                      "what": "AdamW(fused=True) instead of foreach"},
            "compile": {"args": ["--compile"], "pays": True, "compiles": True,
                        "what": "model under torch.compile(mode='reduce-overhead'), optimizer step compiled"},
        },
        "expect": {
            "baseline": "2-layer HF Llama, bf16 autocast, batch 8x512, foreach AdamW: host-bound. One middle step "
                        "is wrapped in ncu_iter, so one period spans two steps (the median ignores it). h200: 10.9 ms",
            "fused": "pays a little: fewer optimizer launches in a host-bound step. h200: 8.5 ms, 1.28x",
            "compile": "pays: CUDA graphs remove the launch overhead; ~35 s to compile. h200: 4.4 ms, 2.5x",
        },
    },
    {
        "name": "gpt2_empty_cache", "script": f"{W}/w_gpt2_empty_cache.py", "args": [],
        "capture_args": ["--steps", "25"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "no_empty_cache": {"args": ["--fix", "no_empty_cache"], "pays": True,
                               "what": "drop torch.cuda.empty_cache() at the end of each step"},
            "fused_adamw": {"args": ["--fix", "fused_adamw"], "pays": True,
                            "what": "AdamW(fused=True) instead of the default foreach"},
        },
        "expect": {
            "baseline": "6-layer GPT-2, bf16 autocast, 8x512 tokens; empty_cache syncs and forces cudaMalloc "
                        "every step. h200: 37.4 ms",
            "no_empty_cache": "pays: no device sync, no cudaMalloc churn. h200: 22.6 ms, 1.65x",
            "fused_adamw": "pays a little: 82M params, fewer optimizer passes and launches. h200: 33.2 ms, 1.13x",
        },
    },
    {
        "name": "vit_grad_norms", "script": f"{W}/w_vit_grad_norms.py", "args": [],
        "capture_args": ["--steps", "20"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "no_item": {"args": ["--fix", "no_item"], "pays": True,
                        "what": "per-parameter grad norms via torch._foreach_norm + stack, kept on the GPU"},
            "fused_adamw": {"args": ["--fix", "fused_adamw"], "pays": True,
                            "what": "AdamW(fused=True) instead of the default foreach"},
        },
        "expect": {
            "baseline": "timm ViT-B/16, batch 64, bf16 autocast; ~150 .item() syncs a step after backward. "
                        "h200: 37.1 ms",
            "no_item": "pays: ~150 sync round trips (GPU idle) removed. h200: 27.8 ms, 1.33x",
            "fused_adamw": "pays a little: 86M params. h200: 31.6 ms, 1.17x",
        },
    },
    {
        "name": "early_exit_sync", "script": f"{W}/w_early_exit_sync.py", "args": ["--steps", "100"],
        "interleave": "all",
        "capture_args": ["--steps", "60"],
        "step_range": "infer", "kind": "inference",
        "fixes": {
            "no_sync": {"args": ["--fix", "no_sync"], "pays": True,
                        "what": "exit decision as torch.where on the GPU instead of .item() mid-forward"},
            "graphs": {"args": ["--fix", "graphs"], "pays": True,
                       "what": ".item() kept; the encoder and the refiner each captured as a CUDA graph"},
        },
        "expect": {
            "baseline": "bf16 MLP encoder (~3 ms GPU), .item() exit check, then ~280 small refiner launches "
                        "with the GPU idle. h200: 9.1 ms",
            "no_sync": "pays: refiner launches overlap the encoder; same GPU work. h200: 5.6 ms, 1.63x",
            "graphs": "pays: the refiner's ~280 launches become one after the sync",
        },
    },
    {
        "name": "resnet18_pageable", "script": f"{W}/w_resnet18_pageable.py", "args": ["--steps", "100"],
        "interleave": "all",
        "capture_args": ["--steps", "60"],
        "step_range": "infer", "kind": "inference",
        "fixes": {
            "pinned": {"args": ["--fix", "pinned"], "pays": True,
                       "what": "input pool in pinned memory, copied with non_blocking=True"},
            "channels_last_bf16": {"args": ["--fix", "channels_last_bf16"], "pays": False,
                                   "what": "model and input in bf16 channels_last (copy unchanged)"},
            "pinned+channels_last_bf16": {"args": ["--fix", "pinned,channels_last_bf16"], "pays": True,
                                          "what": "both"},
        },
        "expect": {
            "baseline": "ResNet-18 fp32 batch 32: 19 MB pageable copy (synchronous, no overlap) + forward. "
                        "h200: 4.9 ms",
            "pinned": "pays: async DMA at full speed, CPU runs ahead. h200: 2.7 ms, 1.79x",
            "channels_last_bf16": "does not pay alone: the synchronous pageable copy dominates, and the bf16 "
                                  "conversion adds a pass. h200: 5.5 ms, 0.89x",
            "pinned+channels_last_bf16": "pays most. h200: 1.8 ms, 2.69x",
        },
    },
    {
        "name": "lstm_cell_loop", "script": f"{W}/w_lstm_cell_loop.py", "args": [],
        "interleave": "all",
        "capture_args": ["--steps", "25"],
        "step_range": "infer", "kind": "inference",
        "fixes": {
            "cuda_graph": {"args": ["--fix", "cuda_graph"], "pays": True,
                           "what": "the whole 256-step cell loop captured in one CUDA graph and replayed"},
            "cudnn_lstm": {"args": ["--fix", "cudnn_lstm"], "pays": True,
                           "what": "nn.LSTM(num_layers=2) (cuDNN) with the same weights instead of the loop"},
        },
        "expect": {
            "baseline": "2-layer LSTMCell loop, 256 timesteps, batch 16: ~1,500 tiny launches a batch, "
                        "launch-bound. h200: 27.8 ms",
            "cuda_graph": "pays: launch overhead gone, the GPU still runs ~1,500 tiny kernels. h200: 10.1 ms, 2.76x",
            "cudnn_lstm": "pays: a handful of cuDNN kernels. h200: 8.9 ms, 3.13x; interleaved 7.6-9.2 ms, "
                          "3.50-3.58x: cuDNN's kernels are faster than the cells' (10.1 ms), which PK106 "
                          "does not price (a floor)",
        },
    },
    {
        "name": "bert_fp32_infer", "script": f"{W}/w_bert_fp32_infer.py", "args": [],
        "interleave": "all",
        "capture_args": ["--steps", "20"],
        "step_range": "infer", "kind": "inference",
        "fixes": {
            "tf32": {"args": ["--fix", "tf32"], "pays": True,
                     "what": "torch.set_float32_matmul_precision('high') (TF32 tensor cores)"},
            "bf16_autocast": {"args": ["--fix", "bf16_autocast"], "pays": True,
                              "what": "forward under torch.autocast(bfloat16)"},
            "cuda_graph": {"args": ["--fix", "cuda_graph"], "pays": False,
                           "what": "forward captured in a CUDA graph and replayed"},
        },
        "expect": {
            "baseline": "BERT-base fp32, 32x256 tokens: ~1.5 TFLOP at fp32 FMA speed, GPU-bound. h200: 35.5 ms",
            "tf32": "pays: GEMMs on tensor cores. h200: 8.8 ms, 4.0x",
            "bf16_autocast": "pays: bf16 GEMMs and attention, host-bound at the CPU's pace. h200: 7.1-7.3 ms, "
                             "5.0x, on the first machines; 12.7-14.4 ms, 2.5-2.8x, on a slower one",
            "cuda_graph": "no gain, a loss: GPU-bound, and under capture HF builds an all-true attention mask, so "
                          "SDPA takes its slower masked fp32 path. h200: 40.2-40.3 ms (two runs), 0.88x",
        },
    },
    {
        "name": "bert_b1_infer", "script": f"{W}/w_bert_b1_infer.py", "args": ["--steps", "200"],
        "interleave": "all",
        "capture_args": ["--steps", "120"],
        "step_range": "infer", "kind": "inference",
        "fixes": {
            "cuda_graph": {"args": ["--fix", "cuda_graph"], "pays": True,
                           "what": "forward captured in a CUDA graph on a static input and replayed"},
            "compile": {"args": ["--fix", "compile"], "pays": None, "compiles": True,
                        "what": "torch.compile(model), default mode"},
        },
        "expect": {
            "baseline": "BERT-base bf16, batch 1 x 128: ~250 launches, host-bound. h200: 4.7 ms",
            "cuda_graph": "pays: one launch a request. h200: 1.15 ms, 4.05x. Not only the launches change: "
                          "under capture HF cannot check that the mask is all ones, so the graph runs the "
                          "masked attention path (fp32 score GEMMs, bool reductions, copies): 1.21 ms of GPU "
                          "work a request against 0.46 ms eager (nsys, bert_b1_infer__cuda_graph), which "
                          "the price of the same work graphed (0.6 ms) cannot know",
            "compile": "unsure: fused kernels, still launched one by one from Python, ~15-20 s to compile. "
                       "h200: 6.0-6.3 ms (0.75x) in the run that compiled with cold Inductor caches, 3.1-4.1 ms "
                       "(1.15-1.5x) in runs that found them warm: use --prime or read the median of 3 reps",
        },
    },
    {
        "name": "generate_llama", "script": f"{W}/w_generate_llama_nvtx.py",
        "args": ["--steps", "64", "--runs", "3"],
        "capture_args": ["--steps", "24", "--runs", "2"],
        "step_range": "decode_step", "kind": "decode",
        "fixes": generate_fixes(),
        "expect": {
            "baseline": "HF generate, 4-layer Llama bf16, batch 1, eager: ~150 launches a token, host-bound; one "
                        "warm-up generate() outside the ranges, then 3 measured (the 2 run boundaries are outlier "
                        "periods). h200: 4.05 ms a token",
            "static": "pays: fused Inductor kernels, fewer launches; compiled in the warm-up call. "
                      "h200: 1.47 ms, 2.8x",
            "graphs": "pays, but no more than static: what is left is generate()'s own Python per token. "
                      "h200: 1.43-1.46 ms, 2.8x",
        },
    },
    {
        "name": "dataloader_cnn", "script": f"{W}/dataloader_cnn.py",
        # More steps than the workers' prefetch buffer (8 x 4 batches) holds past the warm-up:
        # timed inside it, the step runs at the main process's pace, not the workers' (steady
        # state).
        "args": ["--steps", "160"],
        "capture_args": ["--steps", "16"],
        "step_range": "train_step", "kind": "data",
        "fixes": {
            "workers_pin": {"args": ["--workers", "8", "--pin"], "pays": True,
                            "what": "DataLoader(num_workers=8, pin_memory=True), non_blocking copies"},
        },
        "expect": {
            "baseline": "ResNet-18 training fed by per-sample numpy work in the main process (num_workers=0). "
                        "h200: 173 ms",
            "workers_pin": "pays: samples prepared in parallel ahead of the step. h200: 12.1-13.6 ms, "
                           "13.5-15.9x in steady state (8.9 ms, 19x within the prefetch buffer)",
        },
    },
    {
        "name": "numpy_aug_train", "script": f"{W}/w_numpy_aug_train.py",
        "interleave": ["gpu_aug"],
        "args": ["--steps", "120"],  # past the workers' prefetch buffer, as dataloader_cnn
        "capture_args": ["--steps", "16"],
        "step_range": "train_step", "kind": "data",
        "fixes": {
            "workers": {"args": ["--fix", "workers"], "pays": True,
                        "what": "the augmentation in a Dataset read by DataLoader(8 workers, pin_memory)"},
            "gpu_aug": {"args": ["--fix", "gpu_aug"], "pays": True,
                        "what": "uint8 batch copied in; crop, flip, normalise on the GPU"},
        },
        "expect": {
            "baseline": "ResNet-18 training at 128 px, batch 128; numpy augmentation in the loop, outside any "
                        "range. h200: 91 ms",
            "workers": "pays: CPU work spread over 8 processes, ahead of the step. h200: 17.3-17.6 ms, "
                       "3.7x past the prefetch buffer on 2026-12-02 (10.3-12.6 ms within it, 2026-12-01)",
            "gpu_aug": "pays: only a gather and an 8 MB uint8 copy left on the CPU. h200: 11.5 ms, 8.0x",
        },
    },
    {
        "name": "mlp_train_big", "script": f"{W}/w_mlp_train_big.py", "args": [],
        "capture_args": ["--steps", "25"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "cuda_graph": {"args": ["--fix", "cuda_graph"], "pays": False,
                           "what": "whole step (fwd, bwd, capturable AdamW) captured in a CUDA graph"},
            "fused_adamw": {"args": ["--fix", "fused_adamw"], "pays": False,
                            "what": "AdamW(fused=True) instead of the default foreach"},
            "compile": {"args": ["--fix", "compile"], "pays": None, "compiles": True,
                        "what": "torch.compile(model), default mode"},
        },
        "expect": {
            "baseline": "2-block MLP, 65,536 x 1024 rows, bf16 autocast: ~7 TFLOP a step, ~60 launches, "
                        "GPU-bound. h200: 15.5 ms",
            "cuda_graph": "no gain: nothing to hide, the CPU is already far ahead. h200: 15.9 ms, 0.98x",
            "fused_adamw": "small: 17M params, a fraction of a ms of the step. h200: 15.2 ms, 1.02x",
            "compile": "the LayerNorm/GELU/residual passes over 65,536 x 4,096 activations fused; the GEMMs "
                       "stay cuBLAS's",
        },
    },
    {
        "name": "compiled_gpt_train", "script": f"{W}/w_compiled_gpt_train.py", "args": [],
        "capture_args": ["--steps", "25"],
        "step_range": "train_step", "kind": "training", "compiles": True,
        "fixes": {
            "reduce_overhead": {"args": ["--fix", "reduce_overhead"], "pays": False,
                                "what": "torch.compile mode='reduce-overhead' (CUDA graphs) instead of default"},
            "fused_adamw": {"args": ["--fix", "fused_adamw"], "pays": True,
                            "what": "AdamW(fused=True) instead of the default foreach"},
        },
        "expect": {
            "baseline": "4-layer GPT (d=1024), 16x512 tokens, already torch.compile'd (default): GPU-bound; "
                        "~15 s to compile. h200: 8.2 ms",
            "reduce_overhead": "little: launch overhead already hidden behind GPU work. h200: 8.0 ms, 1.02x",
            "fused_adamw": "pays a little: 58M params, ~1 ms of foreach traffic. h200: 7.45 ms, 1.10x",
        },
    },
    {
        "name": "graphed_encoder_infer", "script": f"{W}/w_graphed_encoder_infer.py", "args": ["--steps", "100"],
        "capture_args": ["--steps", "40"],
        "step_range": "infer", "kind": "inference",
        "fixes": {
            "pinned": {"args": ["--fix", "pinned"], "pays": False,
                       "what": "token ids in pinned memory, copied with non_blocking=True"},
            "tf32": {"args": ["--fix", "tf32"], "pays": False,
                     "what": "torch.set_float32_matmul_precision('high') on an all-bf16 model"},
        },
        "expect": {
            "baseline": "6-layer bf16 SDPA encoder, 64x128 tokens, forward as one CUDA graph; 64 KB pageable "
                        "copy a batch. h200: 2.76 ms",
            "pinned": "no gain: only the CPU's few tens of us a batch stop showing as GPU idle. "
                      "h200: 2.75 ms, 1.01x",
            "tf32": "none: there is no fp32 matmul. h200: 2.74 ms, 1.01x",
        },
    },
    {
        "name": "resnet50_train", "script": f"{W}/w_resnet50_train.py", "args": [],
        "interleave": ["fused_sgd", "compile", "compile_graphs"],
        "capture_args": ["--steps", "16"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "fused_sgd": {"args": ["--fix", "fused_sgd"], "pays": False,
                          "what": "SGD(fused=True) instead of the default foreach"},
            "cudnn_benchmark": {"args": ["--fix", "cudnn_benchmark"], "pays": False,
                                "what": "torch.backends.cudnn.benchmark = True"},
            "compile": {"args": ["--fix", "compile"], "pays": None, "compiles": True,
                        "what": "torch.compile(model), default mode"},
            "compile_graphs": {"args": ["--fix", "compile_graphs"], "pays": None, "compiles": True,
                               "what": "torch.compile(model, mode='reduce-overhead')"},
        },
        "expect": {
            "baseline": "ResNet-50, bf16 autocast, channels_last, batch 128: GPU-bound. h200: 29.6-29.7 ms",
            "fused_sgd": "no gain: 25.6M params, the update is a fraction of a ms. h200: 29.4 ms, 1.01x",
            "cudnn_benchmark": "no gain: cuDNN's heuristics already pick well for bf16 NHWC on Hopper; ~10 s "
                               "of benchmarking in the first step. h200: 29.8 ms, 1.00x",
        },
    },
    {
        "name": "handwritten_block_train", "script": f"{W}/w_handwritten_block_train.py", "args": [],
        "capture_args": ["--steps", "25"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "compile": {"args": ["--fix", "compile"], "pays": True, "compiles": True,
                        "what": "torch.compile(model), default mode"},
            "fused_adamw": {"args": ["--fix", "fused_adamw"], "pays": True,
                            "what": "AdamW(fused=True) instead of the default foreach"},
        },
        "expect": {
            "baseline": "3-layer d=2048 decoder, hand-written RMSNorm/SwiGLU/dropout/residual, 4x1024 tokens, "
                        "bf16 autocast: GPU-bound, much of it memory-bound elementwise passes. h200: 16.7 ms",
            "compile": "pays: norms, gate, dropout and residuals fused; ~15 s to compile. "
                       "h200: 12.2-12.4 ms (4 runs), 1.37x",
            "fused_adamw": "pays: 188M params, several ms of foreach passes a step. h200: 14.1 ms, 1.19x",
        },
    },
]


LISTED_LAST: list[dict] = [
    {
        # Not in the corpus: a CUDA graph per padded length (empty_cache kept), PK103's top action
        # here. Captured as a user would (torch.cuda.graph around model(input_ids=...)),
        # transformers 5.17 took its fp32 eager attention path under capture instead of SDPA's
        # flash kernel: 35 ms a 512-token batch against 7.3 ms eager, 0.41x overall, a different
        # program rather than a test of the graph (runs in the _late archive, m1).
        "name": "varlen_empty_cache", "script": f"{W}/w_varlen_empty_cache_infer.py", "args": ["--steps", "60"],
        "capture_args": ["--steps", "32"],
        "step_range": "infer", "kind": "inference",
        "fixes": {
            "no_empty_cache": {"args": ["--fix", "no_empty_cache"], "pays": True,
                               "what": "drop torch.cuda.empty_cache() after each batch"},
            "expandable_segments": {"args": ["--fix", "expandable_segments"], "pays": False,
                                    "what": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, empty_cache kept"},
        },
        "expect": {
            "baseline": "BERT-base bf16, batch 32, length 128/256/384/512 changing every batch, empty_cache "
                        "after each. Periods differ by length (same length sequence in every variant); each "
                        "length's first batch costs ~40 ms of set-up, all within the warm-up. h200: 7.4 ms",
            "no_empty_cache": "pays: no sync, no cudaMalloc churn. h200: 5.5 ms, 1.36x",
            "expandable_segments": "no gain: empty_cache still syncs and unmaps. h200: 7.8 ms, 0.95x",
        },
    },
    {
        "name": "sync_loop", "script": f"{W}/sync_loop.py", "args": ["--steps", "40"],
        "interleave": "all",
        "capture_args": ["--steps", "30"],
        "step_range": "step", "kind": "training",
        "fixes": {
            "no_sync": {"args": ["--no-sync"], "pays": True,
                        "what": "losses kept on the GPU, no loss.item() before the CPU bookkeeping"},
            "graph": {"args": ["--graph"], "pays": None,
                      "what": "loss.item() kept; forward, backward and the fused AdamW step as one CUDA graph"},
        },
        "expect": {
            "baseline": "6x Linear(4096) training, loss.item() then ~2 ms of CPU bookkeeping a step; one "
                        "middle step is wrapped in ncu_iter (one period spans two steps). h200: 6.1 ms",
            "no_sync": "pays: bookkeeping overlaps the GPU work. h200: 4.35 ms, 1.40x",
            "graph": "a little: the step's ~100 launches become one; the GPU still idles during the bookkeeping",
        },
    },
]
