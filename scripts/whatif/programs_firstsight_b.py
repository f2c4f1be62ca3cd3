"""Registry entries of ten what-if corpus programs written to be scored at first sight (kinds the
corpus lacked: detection post-processing, diffusion sampling, speech CTC, GNN message passing,
video 3-D convolutions, a host-bound small model, a large device-to-host copy, an already
compiled step, an EMA loop and contrastive training), in the format of ``PROGRAMS`` in
scripts/whatif/registry.py: name, script (from the repository root), args, capture_args,
step_range, kind, interleave, fixes {args, pays, what, compiles}, expect.

pays: True (expected > 1.05x), False (expected < 1.05x), None (not sure). The expectations were
written with the programs; "h200 first look" in a note is one interleaved run of 4 rounds (3
used) on an H200 (torch 2.11) of an earlier state of the program where the note says so, never
profiled, and no capture was made: a first look, not a result.

Imports only what the registry's programs share (builders.py).
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "detection_postproc_infer", "family": "detection with host post-processing", "script": f"{W}/w_detection_postproc_infer.py", "args": [],
        "capture_args": ["--steps", "40"],
        "step_range": "infer", "kind": "inference", "interleave": "all",
        "fixes": {
            "batched_nms": fix("batched_nms", True, "one threshold mask and one torchvision.ops.batched_nms over "
                                "all images and classes, results copied to the host once"),
            "bf16_channels_last": fix("bf16_channels_last", None, "backbone and heads in bf16 and "
                                       "torch.channels_last; post-processing unchanged"),
            "graph": fix("graph", None, "the forward captured in a CUDA graph on a static input, replayed "
                          "each batch; post-processing unchanged"),
        },
        "expect": {
            "baseline": "YOLO-style detector, fp32, batch 8 x 640 px (~0.3 TFLOP, a few ms of GPU), then a "
                        "per-image, per-class Python loop of masks, nms and tolist: ~500 syncs a batch, "
                        "sync-bound. Expected 25-50 ms. h200 first look: 50.2 ms, but then each variant "
                        "had its own random weights, one class won most boxes in some and not in others, "
                        "and the post-processing's work follows the classes among the candidates; the "
                        "heads are now centred and every variant built from one seed",
            "batched_nms": "pays: a handful of syncs a batch instead of hundreds. Expected 3-6x. "
                           "h200 first look: 7.3 ms, 6.8x (see the baseline's note)",
            "bf16_channels_last": "unsure: speeds up the forward (fp32 convolutions), a part of a sync-bound "
                                  "batch. Expected 1.05-1.5x. h200 first look: 24.4 ms, 2.05x (see the "
                                  "baseline's note)",
            "graph": "unsure: saves the forward's ~200 launches; the syncs stay. Expected 1.0-1.3x. h200 first "
                     "look: 6.0 ms, 8.4x, not believed: that variant's weights sent most boxes to few "
                     "classes (see the baseline's note). Its interleaved timing (12.87x) is not "
                     "reproduced by the program alone: on an H100 (2026-12-05), 8 and 28 batches "
                     "timed whole, baseline 60 ms a batch, graph 23.5 ms (2.55x), the same 1,902 "
                     "detections in the last batch; the pair stands as timed until it is re-timed",
        },
    },
    {
        "name": "unet_diffusion_sample", "family": "diffusion UNet sampling", "script": f"{W}/w_unet_diffusion_sample.py", "args": [],
        "capture_args": ["--steps", "60"],
        "step_range": "denoise_step", "kind": "inference", "interleave": "all",
        "fixes": {
            "channels_last": fix("channels_last", False, "model and latents in torch.channels_last (fp16)"),
            "sdpa": fix("sdpa", None, "hand-written attention replaced by F.scaled_dot_product_attention"),
            "graph": fix("graph", True, "the denoising step (UNet and DDIM update) captured as one CUDA graph "
                          "on static buffers and replayed"),
            "compile": fix("compile", True, "torch.compile(unet), default mode", compiles=True),
        },
        "expect": {
            "baseline": "37M-parameter fp16 UNet, batch 32 x 64 px, one DDIM step an iteration: ~400 launches, "
                        "the GPU's work a little longer than the CPU's launching. Expected 8-12 ms (5-8 ms "
                        "when written). h200 first look: 11.3 ms (the attention's q/k/v then came from a "
                        "1x1 convolution, not yet a Linear on the tokens)",
            "channels_last": "no: GroupNorm in channels_last is slow in PyTorch, which the NHWC convolutions "
                             "do not make up for. Expected 0.8-1.0x. h200 first look: 14.7 ms, 0.77x",
            "sdpa": "unsure: the 256- and 64-token attentions are a small part of the step. Expected 1.0-1.1x. "
                    "h200 first look: 0.92x, with q/k/v then strided in the last dimension (a 1x1 "
                    "convolution's output), since laid out by a Linear on the tokens",
            "graph": "pays a little: the step is mostly GPU-bound. Expected 1.05-1.2x. h200 first look: "
                     "10.3 ms, 1.10x",
            "compile": "pays: GroupNorm+SiLU and the scheduler's element-wise kernels fused, fewer launches. "
                       "Expected 1.2-1.6x; ~30-60 s to compile",
        },
    },
    {
        "name": "speech_conformer_train", "family": "speech: Conformer, CTC", "script": f"{W}/w_speech_conformer_train.py", "args": [],
        "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "bf16": fix("bf16", None, "forward under torch.autocast(bfloat16); CTC loss in fp32"),
            "fused_adamw": fix("fused_adamw", False, "AdamW(fused=True) instead of the default foreach"),
            "compile": fix("compile", None, "torch.compile(model), default mode (recompiles once with dynamic "
                            "shapes: the padded length changes every batch)", compiles=True),
            "sorted_lengths": fix("sorted_lengths", None, "batches of utterances of neighbouring lengths "
                                   "(shuffled batch order): less padding"),
        },
        "expect": {
            "baseline": "8-block Conformer d=256 (14M params), 64 utterances of 4-16 s padded to the longest, "
                        "fp32 GEMMs on the CUDA cores, CTC loss (a sync), ~1,300 launches: near the host/GPU "
                        "balance. Expected 50-80 ms. h200 first look, at 12 blocks and batch 32: 83.4 ms, and "
                        "bf16 1.00x, fused AdamW 1.01x, sorted lengths 1.06x: the CPU set the pace",
            "bf16": "unsure: GEMMs and attention on tensor cores, but the CPU's launching is about as long as "
                    "the fp32 GPU work. Expected 1.0-1.3x",
            "fused_adamw": "small: 14M params in 248 tensors. Expected 1.0-1.03x",
            "compile": "unsure: far fewer kernels to launch, which counts at this size, but dynamic shapes and a "
                       "1-2 min compile. Expected 1.1-1.5x",
            "sorted_lengths": "unsure: the mean padded length drops from ~1,560 to ~1,000 frames, which pays only "
                              "as far as the GPU sets the pace. Expected 1.0-1.3x",
        },
    },
    {
        "name": "gnn_scatter_train", "family": "GNN: scatter / index_add", "script": f"{W}/w_gnn_scatter_train.py", "args": [],
        "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "csr_spmm": fix("csr_spmm", True, "mean aggregation as CSR sparse @ dense (cuSPARSE SpMM), the "
                             "transpose kept for the backward"),
            "bf16": fix("bf16", False, "node features in bf16, forward under torch.autocast(bfloat16): bf16 "
                         "messages and atomics"),
            "fused_adam": fix("fused_adam", False, "Adam(fused=True) on 45K parameters: a control"),
        },
        "expect": {
            "baseline": "2-layer GraphSAGE, 1M nodes, 10M edges, 128 features, full batch: index_select and "
                        "index_add_ over 5 GB of per-edge messages a pass, memory- and atomics-bound. "
                        "Expected 20-50 ms. h200 first look: 57.9 ms",
            "csr_spmm": "pays: no message tensor, no atomics. Expected 2-4x. h200 first look: 14.2 ms, 4.08x",
            "bf16": "no (expected 0.8-1.6x when written: half the bytes, but bf16 atomicAdd may be slower). "
                    "h200 first look: 57.7 ms, 1.00x",
            "fused_adam": "none: the optimizer is microseconds. Expected 1.0x. h200 first look: 1.00x",
        },
    },
    {
        "name": "video_r3d_train", "family": "video: 3-D convolutions", "script": f"{W}/w_video_r3d_train.py", "args": [],
        "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training",
        "interleave": ["channels_last_3d", "bf16_channels_last_3d", "tf32"],
        "fixes": {
            "channels_last_3d": fix("channels_last_3d", True, "model and clips in torch.channels_last_3d, fp32"),
            "bf16_channels_last_3d": fix("bf16_channels_last_3d", True, "channels_last_3d and the forward under "
                                          "torch.autocast(bfloat16)"),
            "cudnn_benchmark": fix("cudnn_benchmark", None, "torch.backends.cudnn.benchmark = True "
                                    "(process-wide: timed in runs of its own)"),
            "tf32": fix("tf32", False, "torch.set_float32_matmul_precision('high'): the final Linear only "
                         "(cuDNN's convolutions are TF32 already)"),
        },
        "expect": {
            "baseline": "torchvision R3D-18, batch 24 x 16 x 112 x 112, fp32 (TF32 convolutions), SGD: ~5.9 "
                        "TFLOP a step, GPU-bound. Expected 55-65 ms. h200 first look at batch 32: 81.2 ms",
            "channels_last_3d": "pays (unsure when written: fp32 NDHWC 3-D convolutions against NCDHW in "
                                "cuDNN). h200 first look at batch 32: 57.0 ms, 1.42x",
            "bf16_channels_last_3d": "pays: bf16 tensor cores and half the activation bytes. Expected 1.6-2.5x. "
                                     "h200 first look at batch 32: 39.6 ms, 2.05x",
            "cudnn_benchmark": "unsure: 3-D convolutions are where cuDNN's heuristics miss most often. "
                               "Expected 1.0-1.2x",
            "tf32": "none: one 512 x 400 GEMM. Expected 1.0x. h200 first look at batch 32: 1.00x",
        },
    },
    {
        "name": "item_loss_small_train", "family": "a sync every step on a small model", "script": f"{W}/w_item_loss_small_train.py", "args": [],
        "capture_args": ["--steps", "60"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "no_item": fix("no_item", False, "loss summed on the GPU, read (logged, NaN-checked) every 50 steps"),
            "compile_graphs": fix("compile_graphs", True, "torch.compile(model, mode='reduce-overhead'), "
                                   ".item() every step kept", compiles=True),
            "graph": fix("graph", True, "forward, backward and capturable AdamW captured by hand in one CUDA "
                          "graph; .item() every step kept, outside it"),
        },
        "expect": {
            "baseline": "4-layer nn.TransformerEncoder d=256, batch 32 x 64, fp32: ~500 launches a step and "
                        "under a ms of GPU work; .item() serialises the CPU's launching and the GPU's run. "
                        "Expected 4-8 ms. h200 first look: 10.4 ms",
            "no_item": "no (unsure when written): the CPU's launch time sets the pace and the GPU's part that "
                       "the sync exposes is small. h200 first look: 10.5 ms, 1.00x",
            "compile_graphs": "pays: forward and backward as graphs, the optimizer's foreach kernels and the "
                              "sync stay. Expected 1.5-2.5x",
            "graph": "pays: one replay a step plus the sync. Expected 3-6x. h200 first look: 3.1 ms, 3.36x",
        },
    },
    {
        "name": "d2h_logits_numpy", "family": "device-to-host logits for numpy", "script": f"{W}/w_d2h_logits_numpy.py", "args": [],
        "capture_args": ["--steps", "30"],
        "step_range": "score_batch", "kind": "inference", "interleave": "all",
        "fixes": {
            "argmax_gpu": fix("argmax_gpu", True, "argmax on the GPU, 16 KB of token ids copied"),
            "pinned": fix("pinned", True, "logits copied into a pinned buffer with non_blocking=True and an "
                           "event waited for; numpy's argmax kept"),
            "half_copy": fix("half_copy", True, "logits copied in fp16 (pageable), widened on the host before "
                              "numpy's argmax"),
        },
        "expect": {
            "baseline": "6-layer bf16 LM, 2 x 256 tokens, ~1 ms of GPU; 66 MB of fp32 logits copied pageable "
                        "into fresh host memory and numpy argmax over 16M floats: host-bound. Expected 40-70 ms. "
                        "h200 first look at 4 x 512 (262 MB): 234 ms, most of it the pageable copy",
            "argmax_gpu": "pays: the copy and the host pass gone. Expected 20-60x. h200 first look at 4 x 512: "
                          "2.0 ms, 117x",
            "pinned": "pays: the copy at DMA speed, the numpy pass stays. Expected 4-8x (1.2-1.7x when written, "
                      "before the pageable copy's cost was seen). h200 first look at 4 x 512: 31.1 ms, 7.5x",
            "half_copy": "pays (unsure when written: half the copied bytes, one more host pass to widen). "
                         "h200 first look at 4 x 512: 140 ms, 1.67x",
        },
    },
    {
        "name": "compiled_step_train", "family": "already compiled step", "script": f"{W}/w_compiled_step_train.py", "args": [],
        "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "compiles": True, "interleave": "all",
        "fixes": {
            "reduce_overhead": fix("reduce_overhead", False, "torch.compile mode='reduce-overhead' (CUDA graphs) "
                                    "instead of the default mode", compiles=True),
            "fused_adamw": fix("fused_adamw", None, "AdamW(fused=True) instead of the default foreach"),
        },
        "expect": {
            "baseline": "ViT-B/16 already torch.compile'd (default), batch 64, bf16 autocast: ~6.8 TFLOP of "
                        "GEMMs and flash attention, GPU-bound; ~30-60 s to compile. Expected 14-22 ms",
            "reduce_overhead": "none: the launches are hidden behind GPU work. Expected 0.98-1.03x",
            "fused_adamw": "a little: 86M params, about 1 ms of foreach passes. Expected 1.03-1.08x",
        },
    },
    {
        "name": "ema_timm_train", "family": "EMA of the weights in a Python loop", "script": f"{W}/w_ema_timm_train.py", "args": [],
        "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "foreach_ema": fix("foreach_ema", False, "EMA as one torch._foreach_lerp_ instead of a Python loop "
                                "of mul_/add_ per tensor"),
            "fused_adamw": fix("fused_adamw", False, "AdamW(fused=True) instead of the default foreach"),
            "bf16": fix("bf16", True, "forward and loss under torch.autocast(bfloat16)"),
        },
        "expect": {
            "baseline": "timm ConvNeXt-Atto, batch 128 x 224 px, fp32, AdamW, per-tensor EMA loop (256 launches): "
                        "GPU-bound by fp32 memory-bound passes. Expected 35-50 ms. h200 first look at batch 256: "
                        "84.2 ms",
            "foreach_ema": "small: the loop's launches are hidden behind GPU work; its GPU time is a few hundred "
                           "tiny kernels (~0.5 ms). Expected 1.01-1.04x. h200 first look at batch 256: 1.01x",
            "fused_adamw": "small: 3.7M params. Expected 1.0-1.03x. h200 first look at batch 256: 1.00x",
            "bf16": "pays: half the bytes in the memory-bound passes, tensor-core convolutions. Expected 1.4-2x. "
                    "h200 first look at batch 256: 45.7 ms, 1.84x",
        },
    },
    {
        "name": "contrastive_clip_train", "family": "contrastive two-tower training", "script": f"{W}/w_contrastive_clip_train.py", "args": [],
        "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "clamp_on_gpu": fix("clamp_on_gpu", False, "logit_scale.data.clamp_ on the GPU instead of reading it "
                                 "with .item() each step"),
            "bf16": fix("bf16", True, "forward and loss under torch.autocast(bfloat16)"),
            "fused_adamw": fix("fused_adamw", False, "AdamW(fused=True) instead of the default foreach"),
        },
        "expect": {
            "baseline": "CLIP-style two towers (4-block ViT d=256 at 128 px, 4-block text transformer), batch "
                        "1,024 pairs, fp32 GEMMs on the CUDA cores, a .item() each step: GPU-bound. "
                        "Expected 30-60 ms. h200 first look: 64.3 ms",
            "clamp_on_gpu": "small: the sync costs only the next step's first launches on an idle GPU. "
                            "Expected 1.0-1.04x. h200 first look: 63.5 ms, 1.01x",
            "bf16": "pays: GEMMs on tensor cores. Expected 3-5x (and then the sync matters more). h200 first "
                    "look: 24.6 ms, 2.61x",
            "fused_adamw": "small: 11M params. Expected 1.0-1.03x. h200 first look: 1.00x",
        },
    },
]
