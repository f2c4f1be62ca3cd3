"""Registry entries of ten what-if corpus programs written to be scored at first sight (kinds the
corpus lacked: detection post-processing, diffusion sampling, speech CTC, GNN message passing,
video 3-D convolutions, a host-bound small model, a large device-to-host copy, an already
compiled step, an EMA loop and contrastive training), in the format of ``PROGRAMS`` in
scripts/whatif_accuracy.py: name, script (from the repository root), args, capture_args,
step_range, kind, interleave, fixes {args, pays, what, compiles}, expect.

pays: True (expected > 1.05x), False (expected < 1.05x), None (not sure). The expectations were
written with the programs, before any capture or timing on the H200.

Imports nothing beyond the standard library.
"""
from __future__ import annotations

W = "scripts/workloads"


def _fix(name: str, pays, what: str, compiles: bool = False) -> dict:
    entry = {"args": ["--fix", name], "pays": pays, "what": what}
    if compiles:
        entry["compiles"] = True
    return entry


PROGRAMS: list[dict] = [
    {
        "name": "detection_postproc_infer", "script": f"{W}/w_detection_postproc_infer.py", "args": [],
        "capture_args": ["--steps", "40"],
        "step_range": "infer", "kind": "inference", "interleave": "all",
        "fixes": {
            "batched_nms": _fix("batched_nms", True, "one threshold mask and one torchvision.ops.batched_nms over "
                                "all images and classes, results copied to the host once"),
            "bf16_channels_last": _fix("bf16_channels_last", False, "backbone and heads in bf16 and "
                                       "torch.channels_last; post-processing unchanged"),
            "graph": _fix("graph", False, "the forward captured in a CUDA graph on a static input, replayed "
                          "each batch; post-processing unchanged"),
        },
        "expect": {
            "baseline": "YOLO-style detector, fp32, batch 8 x 640 px (~0.3 TFLOP, a few ms of GPU), then a "
                        "per-image, per-class Python loop of masks, nms and tolist: ~500 syncs a batch, "
                        "sync-bound. Expected 25-50 ms",
            "batched_nms": "pays: a handful of syncs a batch instead of hundreds. Expected 3-6x",
            "bf16_channels_last": "little: speeds up the forward, a few ms of a sync-bound batch. "
                                  "Expected 1.02-1.1x",
            "graph": "little: saves the forward's ~200 launches (~1-2 ms); the syncs stay. Expected 1.0-1.08x",
        },
    },
    {
        "name": "unet_diffusion_sample", "script": f"{W}/w_unet_diffusion_sample.py", "args": [],
        "capture_args": ["--steps", "60"],
        "step_range": "denoise_step", "kind": "inference", "interleave": "all",
        "fixes": {
            "channels_last": _fix("channels_last", None, "model and latents in torch.channels_last (fp16)"),
            "sdpa": _fix("sdpa", None, "hand-written attention replaced by F.scaled_dot_product_attention"),
            "graph": _fix("graph", True, "the denoising step (UNet and DDIM update) captured as one CUDA graph "
                          "on static buffers and replayed"),
            "compile": _fix("compile", True, "torch.compile(unet), default mode", compiles=True),
        },
        "expect": {
            "baseline": "37M-parameter fp16 UNet, batch 32 x 64 px, one DDIM step an iteration: ~400 launches, "
                        "~3-6 ms of GPU; the CPU's launching about as long: near the host/GPU balance. "
                        "Expected 5-8 ms",
            "channels_last": "unsure: NHWC fp16 convolutions are cuDNN's fast path, but the GroupNorms and the "
                             "attention's reshapes may pay for layout changes; and gains only where the GPU "
                             "sets the pace. Expected 0.95-1.2x",
            "sdpa": "unsure: the 256- and 64-token attentions are a small part of the step. Expected 1.0-1.1x",
            "graph": "pays if host-bound: one launch a step. Expected 1.2-1.8x",
            "compile": "pays: GroupNorm+SiLU and the scheduler's element-wise kernels fused, fewer launches. "
                       "Expected 1.2-1.6x; ~30-60 s to compile",
        },
    },
    {
        "name": "speech_conformer_train", "script": f"{W}/w_speech_conformer_train.py", "args": [],
        "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "bf16": _fix("bf16", True, "forward under torch.autocast(bfloat16); CTC loss in fp32"),
            "fused_adamw": _fix("fused_adamw", False, "AdamW(fused=True) instead of the default foreach"),
            "compile": _fix("compile", None, "torch.compile(model), default mode (recompiles once with dynamic "
                            "shapes: the padded length changes every batch)", compiles=True),
            "sorted_lengths": _fix("sorted_lengths", True, "batches of utterances of neighbouring lengths "
                                   "(shuffled batch order): less padding"),
        },
        "expect": {
            "baseline": "12-block Conformer d=256 (20M params), 32 utterances of 4-16 s padded to the longest, "
                        "fp32 GEMMs on the CUDA cores, CTC loss: GPU-bound. Expected 30-60 ms",
            "bf16": "pays: GEMMs and attention on tensor cores. Expected 2-3x",
            "fused_adamw": "small: 20M params in 368 tensors, well under a ms. Expected 1.0-1.03x",
            "compile": "unsure: fuses LayerNorm/SiLU/GLU/masking passes, but fp32 GEMMs dominate and dynamic "
                       "shapes cost; compile time 1-2 min. Expected 1.05-1.2x",
            "sorted_lengths": "pays: the mean padded length drops from ~1,560 to ~1,000 frames. Expected 1.3-1.5x",
        },
    },
    {
        "name": "gnn_scatter_train", "script": f"{W}/w_gnn_scatter_train.py", "args": [],
        "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "csr_spmm": _fix("csr_spmm", True, "mean aggregation as CSR sparse @ dense (cuSPARSE SpMM), the "
                             "transpose kept for the backward"),
            "bf16": _fix("bf16", None, "node features in bf16, forward under torch.autocast(bfloat16): bf16 "
                         "messages and atomics"),
            "fused_adam": _fix("fused_adam", False, "Adam(fused=True) on 45K parameters: a control"),
        },
        "expect": {
            "baseline": "2-layer GraphSAGE, 1M nodes, 10M edges, 128 features, full batch: index_select and "
                        "index_add_ over 5 GB of per-edge messages a pass, memory- and atomics-bound. "
                        "Expected 20-50 ms",
            "csr_spmm": "pays: no message tensor, no atomics. Expected 2-4x",
            "bf16": "unsure: half the bytes, but bf16 atomicAdd may be slower than fp32's. Expected 0.8-1.6x",
            "fused_adam": "none: the optimizer is microseconds. Expected 1.0x",
        },
    },
    {
        "name": "video_r3d_train", "script": f"{W}/w_video_r3d_train.py", "args": [],
        "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training",
        "interleave": ["channels_last_3d", "bf16_channels_last_3d", "tf32"],
        "fixes": {
            "channels_last_3d": _fix("channels_last_3d", None, "model and clips in torch.channels_last_3d, fp32"),
            "bf16_channels_last_3d": _fix("bf16_channels_last_3d", True, "channels_last_3d and the forward under "
                                          "torch.autocast(bfloat16)"),
            "cudnn_benchmark": _fix("cudnn_benchmark", None, "torch.backends.cudnn.benchmark = True "
                                    "(process-wide: timed in runs of its own)"),
            "tf32": _fix("tf32", False, "torch.set_float32_matmul_precision('high'): the final Linear only "
                         "(cuDNN's convolutions are TF32 already)"),
        },
        "expect": {
            "baseline": "torchvision R3D-18, batch 32 x 16 x 112 x 112, fp32 (TF32 convolutions), SGD: ~7.8 "
                        "TFLOP a step, GPU-bound. Expected 40-70 ms",
            "channels_last_3d": "unsure: fp32 NDHWC 3-D convolutions may or may not beat NCDHW in cuDNN. "
                                "Expected 0.9-1.2x",
            "bf16_channels_last_3d": "pays: bf16 tensor cores and half the activation bytes. Expected 1.6-2.5x",
            "cudnn_benchmark": "unsure: 3-D convolutions are where cuDNN's heuristics miss most often. "
                               "Expected 1.0-1.2x",
            "tf32": "none: one 512 x 400 GEMM. Expected 1.0x",
        },
    },
    {
        "name": "item_loss_small_train", "script": f"{W}/w_item_loss_small_train.py", "args": [],
        "capture_args": ["--steps", "60"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "no_item": _fix("no_item", None, "loss summed on the GPU, read (logged, NaN-checked) every 50 steps"),
            "compile_graphs": _fix("compile_graphs", True, "torch.compile(model, mode='reduce-overhead'), "
                                   ".item() every step kept", compiles=True),
            "graph": _fix("graph", True, "forward, backward and capturable AdamW captured by hand in one CUDA "
                          "graph; .item() every step kept, outside it"),
        },
        "expect": {
            "baseline": "4-layer nn.TransformerEncoder d=256, batch 32 x 64, fp32: ~500 launches a step and "
                        "under a ms of GPU work; .item() serialises the CPU's launching and the GPU's run. "
                        "Expected 4-8 ms",
            "no_item": "unsure: the CPU's launch time still sets the pace; what is saved is the GPU's run "
                       "overlapped with the launches (the GPU part is small). Expected 1.05-1.25x",
            "compile_graphs": "pays: forward and backward as graphs, the optimizer's foreach kernels and the "
                              "sync stay. Expected 1.5-2.5x",
            "graph": "pays: one replay a step plus the sync. Expected 3-6x",
        },
    },
    {
        "name": "d2h_logits_numpy", "script": f"{W}/w_d2h_logits_numpy.py", "args": [],
        "capture_args": ["--steps", "30"],
        "step_range": "score_batch", "kind": "inference", "interleave": "all",
        "fixes": {
            "argmax_gpu": _fix("argmax_gpu", True, "argmax on the GPU, 16 KB of token ids copied"),
            "pinned": _fix("pinned", True, "logits copied into a pinned buffer with non_blocking=True and an "
                           "event waited for; numpy's argmax kept"),
            "half_copy": _fix("half_copy", None, "logits copied in fp16 (pageable), widened on the host before "
                              "numpy's argmax"),
        },
        "expect": {
            "baseline": "6-layer bf16 LM, 4 x 512 tokens, ~1 ms of GPU; 262 MB of fp32 logits copied pageable "
                        "(~15-30 ms) and numpy argmax over 65M floats (~15-30 ms): host-bound. "
                        "Expected 30-60 ms",
            "argmax_gpu": "pays: the copy and the host pass gone. Expected 15-30x",
            "pinned": "pays partly: the copy at DMA speed (~5 ms), the numpy pass stays. Expected 1.2-1.7x",
            "half_copy": "unsure: half the copied bytes, one more 262 MB host pass to widen. Expected 0.8-1.2x",
        },
    },
    {
        "name": "compiled_step_train", "script": f"{W}/w_compiled_step_train.py", "args": [],
        "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "compiles": True, "interleave": "all",
        "fixes": {
            "reduce_overhead": _fix("reduce_overhead", False, "torch.compile mode='reduce-overhead' (CUDA graphs) "
                                    "instead of the default mode", compiles=True),
            "fused_adamw": _fix("fused_adamw", None, "AdamW(fused=True) instead of the default foreach"),
        },
        "expect": {
            "baseline": "ViT-B/16 already torch.compile'd (default), batch 64, bf16 autocast: ~6.8 TFLOP of "
                        "GEMMs and flash attention, GPU-bound; ~30-60 s to compile. Expected 14-22 ms",
            "reduce_overhead": "none: the launches are hidden behind GPU work. Expected 0.98-1.03x",
            "fused_adamw": "a little: 86M params, about 1 ms of foreach passes. Expected 1.03-1.08x",
        },
    },
    {
        "name": "ema_timm_train", "script": f"{W}/w_ema_timm_train.py", "args": [],
        "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "foreach_ema": _fix("foreach_ema", False, "EMA as one torch._foreach_lerp_ instead of a Python loop "
                                "of mul_/add_ per tensor"),
            "fused_adamw": _fix("fused_adamw", False, "AdamW(fused=True) instead of the default foreach"),
            "bf16": _fix("bf16", True, "forward and loss under torch.autocast(bfloat16)"),
        },
        "expect": {
            "baseline": "timm ConvNeXt-Atto, batch 256 x 224 px, fp32, AdamW, per-tensor EMA loop (256 launches): "
                        "GPU-bound by fp32 memory-bound passes. Expected 15-30 ms",
            "foreach_ema": "small: the loop's launches are hidden behind GPU work; its GPU time is a few hundred "
                           "tiny kernels (~0.5 ms). Expected 1.01-1.04x",
            "fused_adamw": "small: 3.7M params. Expected 1.0-1.03x",
            "bf16": "pays: half the bytes in the memory-bound passes, tensor-core convolutions. Expected 1.4-2x",
        },
    },
    {
        "name": "contrastive_clip_train", "script": f"{W}/w_contrastive_clip_train.py", "args": [],
        "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "clamp_on_gpu": _fix("clamp_on_gpu", False, "logit_scale.data.clamp_ on the GPU instead of reading it "
                                 "with .item() each step"),
            "bf16": _fix("bf16", True, "forward and loss under torch.autocast(bfloat16)"),
            "fused_adamw": _fix("fused_adamw", False, "AdamW(fused=True) instead of the default foreach"),
        },
        "expect": {
            "baseline": "CLIP-style two towers (4-block ViT d=256 at 128 px, 4-block text transformer), batch "
                        "1,024 pairs, fp32 GEMMs on the CUDA cores, a .item() each step: GPU-bound. "
                        "Expected 30-60 ms",
            "clamp_on_gpu": "small: the sync costs only the next step's first launches on an idle GPU. "
                            "Expected 1.0-1.04x",
            "bf16": "pays: GEMMs on tensor cores. Expected 3-5x (and then the sync matters more)",
            "fused_adamw": "small: 11M params. Expected 1.0-1.03x",
        },
    },
]
