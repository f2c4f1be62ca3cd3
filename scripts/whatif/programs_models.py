"""Models added after the first programs, most of them as tests of the step model and of the rule
that prices their fixes (``roles``): GPT-2 and ViT in fp32, the torchvision CNNs in inference
(batch 128, and batch 4 where the CPU sets the pace) and in training, and the held-out
transformers (Swin-T, T5, Qwen2 decode, DistilBERT). The fields are the registry's
(``registry``).
"""
from __future__ import annotations

from .builders import (W, cnn_inference, cnn_inference_fixes, cnn_training, finetune_fixes, generate_fixes,
                       small_batch_inference, tf32_fix)

# PK403's fix on the CNNs where it is or was near the top action (a compile: Inductor's caches primed first)
FREEZE_COMPILE = {"args": ["--fix", "freeze_compile"], "pays": True, "compiles": True,
                  "what": "torch.compile with torch._inductor.config.freezing: BatchNorm folded into the "
                          "convolutions, activations and adds fused"}

PROGRAMS: list[dict] = [
    {
        "name": "gpt2_fp32_train", "script": f"{W}/w_gpt2_fp32_train.py", "args": [],
        "capture_args": ["--steps", "16"],
        # the GEMM shapes (the LM head's 50,257 columns) from a --aten capture of the same program
        "shapes_from": "traces/real/train_gpt2_fp32_rec.sqlite.xz",
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "tf32": {"args": ["--fix", "tf32"], "pays": True,
                     "what": "torch.set_float32_matmul_precision('high')"},
            "bf16_autocast": {"args": ["--fix", "bf16_autocast"], "pays": True,
                              "what": "forward under torch.autocast(bfloat16)"},
            "fused_adamw": {"args": ["--fix", "fused_adamw"], "pays": None,
                            "what": "AdamW(fused=True) instead of the default foreach"},
        },
        "expect": {
            "baseline": "GPT-2 124M, fp32 without TF32, batch 8x512: fp32 GEMMs on the CUDA cores, GPU-bound",
            "tf32": "pays: the GEMMs on the tensor cores",
            "bf16_autocast": "pays more: bf16 GEMMs and half the activation bytes",
            "fused_adamw": "a little: 124M params, ~10 foreach passes become one",
        },
    },
    {
        # Added after PK302's bf16 pricing (autocast's casts, attention) was last changed: a model
        # it was not built on, captured and timed in one allocation.
        "name": "vit_fp32_infer", "script": f"{W}/w_vit_fp32_infer.py", "args": [],
        "capture_args": ["--steps", "20"],
        "step_range": "infer", "kind": "inference",
        "fixes": {
            "tf32": {"args": ["--fix", "tf32"], "pays": True,
                     "what": "torch.set_float32_matmul_precision('high')"},
            "bf16_autocast": {"args": ["--fix", "bf16_autocast"], "pays": True,
                              "what": "forward under torch.autocast(bfloat16)"},
        },
        "expect": {
            "baseline": "torchvision ViT-B/16 fp32, batch 64 at 224 px: fp32 GEMMs on the CUDA cores, GPU-bound",
            "tf32": "pays: the GEMMs on the tensor cores",
            "bf16_autocast": "pays: bf16 GEMMs and attention, with autocast's casts on the CPU",
        },
    },
    {
        "name": "resnet50_fp32_infer", "script": f"{W}/w_resnet50_fp32_infer.py", "args": [],
        "capture_args": ["--steps", "20"],
        "step_range": "infer", "kind": "inference", "interleave": "all",
        "fixes": {**cnn_inference_fixes(channels_last_pays=None), "freeze_compile": FREEZE_COMPILE},
        "expect": {
            "baseline": "torchvision ResNet-50 fp32 NCHW, batch 128: TF32 convolutions with cuDNN's layout "
                        "transposes, GPU-bound",
            "channels_last": "the transposes go",
            "bf16_channels_last": "pays: bf16 convolutions, half the bytes between them",
            "tf32": "no gain: the convolutions already run as TF32",
            "freeze_compile": "PK403's fix, added as a test of its edit of 2026-12-08 (BatchNorm folded, every "
                              "run between library kernels fused, the convolutions channels_last): priced "
                              "1.97x at capture before any timing, second to PK305's bf16 and channels_last",
        },
    },
    cnn_inference("efficientnet_b0_fp32_infer", "efficientnet_b0", {
        "baseline": "torchvision EfficientNet-B0 fp32 NCHW inference, batch 128: PyTorch's own depthwise "
                    "kernels; timed after PK305's depthwise estimate, as a test of it in inference",
        "channels_last": "pays: the depthwise convolutions go to cuDNN. h200: 9.23 ms from 12.50, 1.35x "
                         "(priced 1.31x)",
        "bf16_channels_last": "pays, by how much varies: 11.50, 6.68, 6.54 and 6.56 ms in four runs on two "
                              "machines, 1.09-1.90x (priced 2.31x until its bf16 capture showed the depthwise "
                              "and broadcast kernels no faster in bf16: no test of that)",
        "tf32": "no gain: the convolutions already run as TF32. h200: 1.00x",
        "freeze_compile": "PK403's fix, added as a test of its edit of 2026-12-08 (BatchNorm folded, every "
                          "run between library kernels fused, the convolutions channels_last): priced 2.22x "
                          "at capture before any timing, its top action above PK305's 2.14x",
    }, channels_last_pays=True, steps=20, fixes={"freeze_compile": FREEZE_COMPILE}),
    cnn_inference("mobilenet_v3_fp32_infer", "mobilenet_v3_large", {
        "baseline": "torchvision MobileNetV3-Large fp32 NCHW inference, batch 128: PyTorch's depthwise "
                    "kernels, hardswish, squeeze-and-excitation; added after PK305's bf16 exceptions "
                    "(broadcasts, NHWC depthwise) as a test of them",
        "channels_last": "pays a little: the depthwise convolutions go to cuDNN. h200: 5.65-8.73 ms from "
                         "7.50-7.89, 1.12x (priced 1.14x)",
        "bf16_channels_last": "about nothing: 7.06-7.96 ms, 1.03x (priced 1.16x)",
        "tf32": "no gain: the convolutions already run as TF32. h200: 1.04x",
        "freeze_compile": "PK403's fix, added later as its test (its top action, never timed): "
                          "BatchNorm folded, hardswish and the adds fused; the depthwise "
                          "convolutions unchanged. Expected 1.1-1.4x",
    }, channels_last_pays=True, fixes={"freeze_compile": FREEZE_COMPILE}),
    cnn_inference("convnext_tiny_fp32_infer", "convnext_tiny", {
        "baseline": "torchvision ConvNeXt-Tiny fp32 NCHW inference, batch 128: cuDNN's 7x7 depthwise "
                    "convolutions, LayerNorm, fp32 GELU MLPs on the CUDA cores; added after PK305's "
                    "bf16 exceptions as a test of them",
        "channels_last": "little: cuDNN runs the depthwise convolutions in NHWC already. h200: 1.01x",
        "bf16_channels_last": "pays most: the MLPs' fp32 GEMMs on the tensor cores. h200: 11.97 ms from "
                              "40.83, 3.41x (first priced 1.00x: PK305 did not fire; no test of the fix)",
        "tf32": "pays: the MLPs' GEMMs are fp32 on the CUDA cores. h200: 19.64 ms, 2.08x (priced 2.15x)",
    }, channels_last_pays=None, fixes={"tf32": {"args": ["--fix", "tf32"], "pays": True,
                                  "what": "torch.set_float32_matmul_precision('high'): the MLPs' Linear layers"}}),
    cnn_inference("regnet_y_800mf_fp32_infer", "regnet_y_800mf", {
        "baseline": "torchvision RegNetY-800MF fp32 NCHW inference, batch 128: grouped convolutions, "
                    "squeeze-and-excitation; added after all of PK305's changes of 2026-12-02, as a test",
        "channels_last": "pays: the layout transposes go. h200: 7.55 ms from 9.92, 1.31x (priced 1.14x)",
        "bf16_channels_last": "pays, by how much varies: 9.28 and 6.79 ms in two runs, 1.27x (priced 1.24x)",
        "tf32": "no gain: the convolutions already run as TF32. h200: 1.00x",
        "freeze_compile": "PK403's fix, added later as its test (its top action, never timed): "
                          "BatchNorm folded, the activations and adds fused. Expected 1.1-1.4x",
    }, channels_last_pays=None, fixes={"freeze_compile": FREEZE_COMPILE}),
    small_batch_inference("resnet50_b4_infer", "resnet50", {
        "baseline": "torchvision ResNet-50 fp32 NCHW inference at batch 4: about 170 launches of a few "
                    "microseconds of GPU work each, the CPU's launch path the pace; added after the model's "
                    "last change, as a test",
        "channels_last": "should not pay: the GPU waits for the CPU either way",
        "bf16_channels_last": "should not pay, for the same reason",
        "tf32": "no gain",
        "cuda_graph": "pays: one launch a batch",
    }),
    small_batch_inference("efficientnet_b0_b4_infer", "efficientnet_b0", {
        "baseline": "torchvision EfficientNet-B0 fp32 NCHW inference at batch 4: depthwise convolutions, "
                    "squeeze-and-excitation, SiLU, about 250 launches of microseconds each, host-bound; added "
                    "after PK103's whole-step graph edit, as a test of it",
        "channels_last": "should not pay: the GPU waits for the CPU either way",
        "bf16_channels_last": "should not pay, for the same reason",
        "tf32": "no gain",
        "cuda_graph": "pays: one launch a batch",
    }),
    small_batch_inference("mobilenet_v3_b4_infer", "mobilenet_v3_large", {
        "baseline": "torchvision MobileNetV3-Large fp32 NCHW inference at batch 4: depthwise convolutions, "
                    "hardswish, squeeze-and-excitation, host-bound; added after PK103's whole-step graph "
                    "edit, as a second test of it (only the graph timed: the small fixes of a host-bound "
                    "program vary more from run to run than the target band)",
        "cuda_graph": "pays: one launch a batch",
    }),
    {
        "name": "resnet18_fp32_train", "script": f"{W}/w_resnet18_fp32_train.py", "args": [],
        "capture_args": ["--steps", "20"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "channels_last": {"args": ["--fix", "channels_last"], "pays": None,
                              "what": "model and input in torch.channels_last, fp32"},
            "bf16_channels_last": {"args": ["--fix", "bf16_channels_last"], "pays": True,
                                   "what": "channels_last, forward and loss under torch.autocast(bfloat16)"},
            "fused_sgd": {"args": ["--fix", "fused_sgd"], "pays": False,
                          "what": "SGD(fused=True) instead of the default foreach"},
        },
        "expect": {
            "baseline": "torchvision ResNet-18 training, fp32 NCHW, batch 128: TF32 convolutions with cuDNN's "
                        "layout transposes, GPU-bound",
            "channels_last": "the transposes go",
            "bf16_channels_last": "pays: bf16 convolutions, half the bytes between them",
            "fused_sgd": "small: 11.7M parameters",
        },
    },
    {
        "name": "resnet50_fp32_train", "script": f"{W}/w_resnet18_fp32_train.py", "args": ["--arch", "resnet50"],
        "capture_args": ["--arch", "resnet50", "--steps", "12"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "channels_last": {"args": ["--fix", "channels_last"], "pays": None,
                              "what": "model and input in torch.channels_last, fp32"},
            "bf16_channels_last": {"args": ["--fix", "bf16_channels_last"], "pays": True,
                                   "what": "channels_last, forward and loss under torch.autocast(bfloat16)"},
        },
        "expect": {
            "baseline": "torchvision ResNet-50 training, fp32 NCHW, batch 128: a second CNN for PK305's "
                        "BatchNorm estimate, timed after it was made",
            "channels_last": "the transposes go, cuDNN's NCHW BatchNorm of training is replaced",
            "bf16_channels_last": "pays: bf16 convolutions, half the bytes between them",
        },
    },
    # CNNs the model was not built on, each captured and timed in one allocation.
    cnn_training("densenet121_fp32_train", "densenet121",
                  "torchvision DenseNet-121, batch 128: BatchNorm and concatenations between thin convolutions",
                  "pays: transposes and NCHW BatchNorm go. h200: 64.5 ms from 85.2, 1.32x (first priced 1.30x)",
                  "pays, no more than channels_last: 65.8-72.9 ms, 1.17-1.40x (first priced 1.45x)"),
    cnn_training("efficientnet_b0_fp32_train", "efficientnet_b0",
                  "torchvision EfficientNet-B0, batch 128: depthwise convolutions, SiLU, squeeze-and-excitation",
                  "pays most: PyTorch's NCHW depthwise kernels give way to cuDNN's. h200: 34.0 ms from 62.4, "
                  "1.84x (first priced 1.00x: no rule fired)",
                  "pays, less than channels_last alone: 35.2-36.5 ms, 1.71x (first priced 1.00x)"),
    cnn_training("resnext50_fp32_train", "resnext50_32x4d",
                  "torchvision ResNeXt-50 32x4d, batch 128: grouped convolutions on eight cuDNN side streams",
                  "pays: h200: 59.2 ms from 77.0, 1.30x (first priced 1.22x)",
                  "pays most: 36.9 ms, 2.09x (first priced 1.43x)"),
    cnn_training("mobilenet_v3_fp32_train", "mobilenet_v3_large",
                  "torchvision MobileNetV3-Large, batch 128: depthwise convolutions, hardswish, "
                  "squeeze-and-excitation; timed after PK305's depthwise estimate",
                  "pays: h200: 22.4-27.5 ms from 44.5, 1.71x (priced 2.00x)",
                  "pays most: 22.9-32.2 ms, 1.88x (priced 2.02x)"),
    cnn_training("convnext_tiny_fp32_train", "convnext_tiny",
                  "torchvision ConvNeXt-Tiny, batch 128: 7x7 depthwise convolutions, LayerNorm, fp32 GELU MLPs; "
                  "timed after PK305's depthwise estimate",
                  "no gain: h200: 183.4 ms from 184.2, 1.00x (priced 1.00x)",
                  "pays most: 46.8 ms, 3.93x (first priced 1.78x, then 2.37x before cuDNN's depthwise weight "
                  "gradients were priced from its bf16 capture: no test of that)", pays=(False, True),
                  more={"bf16_compile": {
                      "args": ["--fix", "bf16_channels_last", "--fix", "compile"], "pays": True, "compiles": True,
                      "what": "bf16_channels_last and the model under torch.compile (default mode)",
                      "expect": "the combiner's plan PK305 + PK103 (bf16 and compile), priced 5.51x before "
                                "it was timed: autocast's casts leave the bf16 step host-bound, which "
                                "Inductor's fusion takes away"}}),
    {
        # Held out: added after the last change of the step model and PK302, captured and timed
        # in one allocation.
        "name": "swin_t_fp32_train", "script": f"{W}/w_resnet18_fp32_train.py", "args": ["--arch", "swin_t"],
        "capture_args": ["--arch", "swin_t", "--steps", "12"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            "tf32": tf32_fix(),
            "bf16_autocast": {"args": ["--fix", "bf16_channels_last"], "pays": True,
                              "what": "forward and loss under torch.autocast(bfloat16) (and channels_last, "
                                      "which reaches only the patch embedding)"},
            "compile": {"args": ["--fix", "compile"], "pays": None, "compiles": True,
                        "what": "the model under torch.compile (default mode), fp32"},
        },
        "expect": {
            "baseline": "torchvision Swin-T fp32, batch 128 at 224 px, SGD: fp32 GEMMs on the CUDA cores, window "
                        "partitions, shifts and LayerNorms between them; GPU-bound",
            "tf32": "pays: the GEMMs on the tensor cores",
            "bf16_autocast": "pays: bf16 GEMMs and attention, with autocast's casts",
            "compile": "some: the elementwise, LayerNorm and window reshuffles between GEMMs fused",
        },
    },
    {
        # Held out, as swin_t_fp32_train.
        "name": "t5_finetune", "script": f"{W}/w_t5_finetune.py", "args": [],
        "interleave": "all",
        "capture_args": ["--steps", "20"],
        "step_range": "train_step", "kind": "training",
        "fixes": {
            **finetune_fixes(no_item_pays=None),
            "compile_graphs": {"args": ["--fix", "compile_graphs"], "pays": None, "compiles": True,
                               "what": "the model under torch.compile(mode='reduce-overhead'); optimizer and "
                                       ".item() eager"},
        },
        "expect": {
            "baseline": "HF T5-small fine-tuning, fp32, batch 32, 256 source and 64 target tokens, loss.item() "
                        "every step",
            "tf32": "pays: the GEMMs on the tensor cores",
            "bf16_autocast": "pays: bf16 GEMMs, with autocast's casts on the CPU",
            "fused_adamw": "small: 60M parameters",
            "no_item": "little while the step is GPU-bound",
            "compile_graphs": "PK103's top action (CUDA graphs between the step's syncs), timed after it was "
                              "priced",
        },
    },
    {
        # Held out, as swin_t_fp32_train.
        "name": "generate_qwen2", "script": f"{W}/w_generate_llama_nvtx.py",
        "args": ["--arch", "qwen2", "--steps", "64", "--runs", "3"],
        "capture_args": ["--arch", "qwen2", "--steps", "16", "--runs", "2"],
        "step_range": "decode_step", "kind": "decode",
        "fixes": generate_fixes(),
        "expect": {
            "baseline": "HF generate, a Qwen2.5-0.5B-shaped decoder (24 layers, 896 wide, GQA) in bf16, batch 1, "
                        "eager: host-bound",
            "static": "pays: fused Inductor kernels, fewer launches",
            "graphs": "pays most: one graph launch a token for the forward",
        },
    },
    {
        "name": "distilbert_finetune", "script": f"{W}/w_distilbert_finetune.py", "args": [],
        "capture_args": ["--steps", "20"],
        "step_range": "train_step", "kind": "training",
        "fixes": finetune_fixes(no_item_pays=False),
        "expect": {
            "baseline": "HF DistilBERT fine-tuning, fp32, batch 32 x 256, loss.item() every step: GPU-bound",
            "tf32": "pays: the GEMMs on the tensor cores",
            "bf16_autocast": "pays: bf16 GEMMs and attention, with autocast's casts on the CPU",
            "fused_adamw": "small: 67M parameters against a fp32 step of tens of ms",
            "no_item": "no gain while the step is GPU-bound: the sync costs a queue refill",
        },
    },
]
