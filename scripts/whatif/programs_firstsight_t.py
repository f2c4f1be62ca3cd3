"""First-sight set T: semantic segmentation trained in fp32 at full resolution
(``segmentation_deeplab_train``: torchvision's DeepLabV3 with a MobileNetV3 backbone, the loss
over every pixel of 512 x 512 images), a recurrent language model trained on packed
variable-length sequences (``packed_lstm_lm_train``: ``pack_padded_sequence`` with lengths that
come from the GPU) and an LLM step whose loss upcasts a 128k vocabulary's logits to float32
(``llama_bigvocab_loss_train``). Entries as in set A (programs_firstsight_a.py): ``pays`` and
``expect`` written with the programs, before any run.
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "segmentation_deeplab_train", "family": "semantic segmentation: a DeepLabV3 MobileNetV3 "
                                                      "trained in fp32 at full resolution",
        "script": f"{W}/w_segmentation_deeplab_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "bf16": fix("bf16", None, "bf16 autocast over the forward and the loss, NCHW kept"),
            "channels_last_bf16": fix("channels_last_bf16", True, "model and images in torch.channels_last, "
                                                                  "bf16 autocast"),
            "compile": fix("compile", True, "torch.compile(model)", compiles=True),
            "tf32": fix("tf32", False, "TF32 for float32 matmuls (a control: no GEMM outside cuDNN's "
                                       "convolutions, TF32 already)"),
        },
        "expect": {
            "baseline": "about 79 GMAC of convolutions forward at batch 8 x 512 x 512, 64 of them the ASPP and "
                        "head's dense convolutions at 32 x 32 (TF32: ~470 GFLOP a step forward and backward, "
                        "~2-3 ms); the backbone's convolutions, BatchNorm and hardswish write ~2.7 GB of fp32 "
                        "NCHW activations forward, read and written again backward (~15-20 GB of HBM "
                        "traffic, its depthwise convolutions on NCHW kernels); the full-resolution loss over "
                        "44M logits and the upsampling's atomic backward ~1-2 ms. MobileNetV3-Large trained "
                        "at batch 128 x 224 x 224 (three times the pixels) took 44.5 ms on an H200. Expected "
                        "15-25 ms a step on an H100, GPU-paced, memory-bound",
            "bf16": "unsure: the ASPP's convolutions on bf16 tensor cores and every elementwise pass in half the "
                    "bytes, but cuDNN transposes NCHW around its bf16 kernels, the depthwise convolutions gain "
                    "little and the loss upcasts the logits. Expected 1.0-1.4x",
            "channels_last_bf16": "pays most: NHWC bf16 convolutions without transposes and half the "
                                  "activation bytes (MobileNetV3-Large's training measured 1.88x so); the "
                                  "loss at full resolution stays float32. Expected 1.5-2.1x",
            "compile": "pays: BatchNorm's statistics and normalisation fused with hardswish and the "
                       "squeeze-and-excitation's scale, maybe the convolutions put in channels_last by "
                       "Inductor's layout choice; they stay cuDNN's, in TF32. Expected 1.2-1.7x",
            "tf32": "does not pay: the model's only GEMMs are cuDNN's convolutions, which run as TF32 already. "
                    "Expected 0.98-1.02x",
        },
    },
    {
        "name": "packed_lstm_lm_train", "family": "a recurrent LM trained on packed variable-length sequences "
                                                "(pack_padded_sequence)",
        "script": f"{W}/w_packed_lstm_lm_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "cpu_lengths": fix("cpu_lengths", False, "the data's host lengths handed to the model: no "
                                                     "device-to-host copy of them"),
            "sorted_buckets": fix("sorted_buckets", True, "each batch from one bucket of lengths 16 wide, sorted, "
                                                          "enforce_sorted=True"),
            "no_pack": fix("no_pack", None, "the LSTM over the padded batch, the loss masked: no packing"),
            "bf16": fix("bf16", True, "bf16 autocast over the forward and the loss"),
        },
        "expect": {
            "baseline": "64 sequences padded to the longest of their lengths (~252; ~8,700 real tokens of "
                        "~16,100 positions). The 1024 x 10,000 head in fp32 on the CUDA cores over every "
                        "padded position: ~1 TFLOP forward and backward at ~50 TFLOP/s, ~18-20 ms; cuDNN's "
                        "LSTM in TF32 (~260 GFLOP forward, most of its time ~250 sequential timesteps a layer "
                        "of 64-row recurrent GEMMs: latency-bound, ~6-12 ms forward and backward); the loss "
                        "over 645 MB of fp32 logits ~2 ms; three host copies a step that wait for the GPU "
                        "and ~200 small packing copies. Expected 28-40 ms a step on an H100, GPU-bound by "
                        "the fp32 head and the recurrence",
            "cpu_lengths": "does not pay: the lengths' copy goes, but pack_padded_sequence copies its sort "
                           "order to the GPU from pageable memory, a blocking copy that waits for the same "
                           "queue: the GPU drains there instead. Expected 0.98-1.03x",
            "sorted_buckets": "pays: the longest length of a batch falls from ~252 to its bucket's top (~144 "
                              "on average): the head, the loss and the LSTM's sequential steps ~43% shorter, "
                              "the input GEMMs and Adam as they were; the order's two copies go. Expected "
                              "1.35-1.75x",
            "no_pack": "unsure: no host copies and no packing kernels, but the LSTM's input GEMMs run over "
                       "every padded position (1.85x their rows) and cuDNN steps all 64 rows at each "
                       "timestep. Expected 0.95-1.08x",
            "bf16": "pays: the head's GEMMs on bf16 tensor cores (~20 ms to ~2), the LSTM in float16 "
                    "(autocast's cuDNN RNN wrapper casts to half whatever the autocast type, re-flattening "
                    "its weights each step); the loss upcasts the logits. Expected 1.8-2.8x",
        },
    },
    {
        "name": "llama_bigvocab_loss_train", "family": "an LLM step whose loss upcasts a 128k-vocabulary's "
                                                     "logits to float32",
        "script": f"{W}/w_llama_bigvocab_loss_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "bf16_loss": fix("bf16_loss", True, "the shifted cross entropy on the bf16 logits, outside "
                                                "autocast: no float32 copy"),
            "chunked_loss": fix("chunked_loss", False, "the LM head and the float32 loss over chunks of 1,024 "
                                                       "tokens from the hidden states"),
            "compile": fix("compile", True, "torch.compile(model)", compiles=True),
            "fused_adamw": fix("fused_adamw", True, "AdamW(fused=True)"),
        },
        "expect": {
            "baseline": "4,096 tokens through 2 layers and a 128,256-vocabulary head: ~3.9 TFLOP of bf16 GEMMs a "
                        "step, 3.2 of them the head's three (~6-7 ms); the loss's float32 copy of the logits "
                        "(2.1 GB: the cast, log-softmax forward and backward, nll's dense gradient, the cast "
                        "back: ~20-25 GB of traffic, ~7-9 ms); foreach AdamW's ~10 passes over 286M fp32 "
                        "parameters and states (~23 GB, ~7-8 ms); autocast's cast of the head's weight. "
                        "Expected 20-30 ms a step on an H100, GPU-paced, memory-bound beyond the GEMMs",
            "bf16_loss": "pays: no float32 copy, the log-softmax and its backward over bf16 logits: ~13-15 GB "
                         "less traffic, ~5 ms. Expected 1.15-1.35x",
            "chunked_loss": "does not pay: the same float32 passes, a chunk at a time (memory, not time), and "
                            "four head GEMMs a quarter the size whose weight gradients are added. Expected "
                            "0.95-1.03x",
            "compile": "pays: Inductor fuses the upcast, the log-softmax and its backward over the logits into "
                       "a few passes over bf16, with RMSNorm, rotary and SwiGLU; the optimizer stays eager. "
                       "Expected 1.2-1.5x",
            "fused_adamw": "pays: one pass over parameters, gradients and both states (~8 GB) for the foreach "
                           "passes' ~23 GB: ~5 ms. Expected 1.15-1.35x",
        },
    },
]
