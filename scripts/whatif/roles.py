"""What each (program, fix) pair of the corpus is evidence of, and which rule of profkit's catalogue
prices it.

``role``: "built on", "no test" or "test" (``BUILT_ON``, ``NO_TEST``); the page counts the
pairs of each role apart.

``FIX_RULES``: the rule that proposes each fix (None: no rule proposes it; predicted 1.00x). For
PK103 the evidence key names the variant (CUDA graph alone, torch.compile's default mode: the
fusion alone, or torch.compile with graphs; in a step that holds blocking calls, the pieces
between them: HF generate()'s static cache compiles the decode forward, which runs between
generate()'s own syncs).

A new program's pairs are tests unless named here; a fix with no entry in ``FIX_RULES`` is priced
1.00x ("no rule proposes it").
"""
from __future__ import annotations

# The torchvision CNNs of builders.cnn_inference and builders.cnn_training (and
# resnet50_fp32_infer), each fix priced by PK305's evidence of it (TF32 by PK302's).
CNN_INFERENCE = ("resnet50_fp32_infer", "efficientnet_b0_fp32_infer", "mobilenet_v3_fp32_infer",
                 "convnext_tiny_fp32_infer", "regnet_y_800mf_fp32_infer", "resnet50_b4_infer",
                 "efficientnet_b0_b4_infer", "mobilenet_v3_b4_infer")
CNN_TRAINING = ("densenet121_fp32_train", "efficientnet_b0_fp32_train", "resnext50_fp32_train",
                "mobilenet_v3_fp32_train", "convnext_tiny_fp32_train")
# What each pair is evidence of. "built on": the first programs of the corpus, timed while the
# step model and the rules were written (allocations 1-6 and 8 of the data's note); "no test": a
# later pair whose miss led to a change of the model or of the rule that prices it (the rule's
# --explain says which); every other pair is a test: first priced after the model and the rule
# that price it were written, and no change of them came from it.
BUILT_ON = {"train_llama", "gpt2_empty_cache", "vit_grad_norms", "early_exit_sync", "resnet18_pageable",
            "lstm_cell_loop", "bert_fp32_infer", "bert_b1_infer", "generate_llama", "dataloader_cnn",
            "numpy_aug_train", "mlp_train_big", "compiled_gpt_train", "graphed_encoder_infer",
            "resnet50_train", "handwritten_block_train", "varlen_empty_cache", "sync_loop"}
NO_TEST = {
    ("resnet18_fp32_train", "channels_last"): "led to PK305's NCHW BatchNorm estimate",
    ("resnet50_fp32_train", "bf16_channels_last"): "led to the step model's launch-queue depth",
    ("efficientnet_b0_fp32_train", "channels_last"): "led to PK305's NCHW depthwise estimate",
    ("efficientnet_b0_fp32_train", "bf16_channels_last"): "led to PK305's NCHW depthwise estimate",
    ("resnext50_fp32_train", "channels_last"): "led to the launch queue and latency beside side streams",
    ("resnext50_fp32_train", "bf16_channels_last"): "led to the launch queue and latency beside side streams",
    ("convnext_tiny_fp32_train", "bf16_channels_last"): "led to PK305's fp32 GEMMs and depthwise weight gradients",
    ("efficientnet_b0_fp32_infer", "bf16_channels_last"): "led to PK305's bf16 exceptions",
    ("convnext_tiny_fp32_infer", "bf16_channels_last"): "led to counting cuDNN's depthwise kernels",
    ("resnet50_b4_infer", "bf16_channels_last"): "led to PK305's added launches of a bf16 BatchNorm",
    ("efficientnet_b0_b4_infer", "bf16_channels_last"): "led to PK305's added launches of a bf16 BatchNorm",
    ("mobilenet_v3_b4_infer", "bf16_channels_last"): "led to PK305's added launches of a bf16 BatchNorm",
    ("generate_qwen2", "static"): "led to PK103 not refusing graphs for an allocator that grew once",
    ("generate_qwen2", "graphs"): "led to PK103 not refusing graphs for an allocator that grew once",
    ("t5_finetune", "compile_graphs"): "led to PK103 pricing the captured pieces with Inductor's fusion too",
    ("t5_finetune", "bf16_autocast"): "led to PK302's price of bf16 below 1 (and its warning)",
    ("resnet50_b4_infer", "cuda_graph"): "led to PK103's whole-step graph taking the Python inside the step's range",
    ("gpt2_fp32_train", "tf32"): "led to PK302's unaligned GEMMs (their shapes need --aten, which this capture has not)",
}


def role(prog: str, fix: str) -> str:
    """What the pair is evidence of: "built on", "no test" or "test" (see BUILT_ON, NO_TEST)."""
    if prog in BUILT_ON:
        return "built on"
    return "no test" if (prog, fix) in NO_TEST else "test"


# (program, fix) -> (the rule that proposes it, or rules joined by + for a fix that does what
# several propose; the evidence key of the variant the fix is, where the rule prices several:
# its price, or with + the edit of that variant replayed with the others')
FIX_RULES = {
    **{(name, fix): ("PK305", f"{fix}_speedup") for name in CNN_TRAINING
       for fix in ("channels_last", "bf16_channels_last")},
    # --compile compiles the model (reduce-overhead) and the optimizer step (its foreach kernels
    # fused): the two rules' edits replayed together
    ("train_llama", "fused"): ("PK201", None), ("train_llama", "compile"): ("PK103+PK201", None),
    ("gpt2_empty_cache", "no_empty_cache"): ("PK105", None), ("gpt2_empty_cache", "fused_adamw"): ("PK201", None),
    ("vit_grad_norms", "no_item"): ("PK101", None), ("vit_grad_norms", "fused_adamw"): ("PK201", None),
    ("early_exit_sync", "no_sync"): ("PK101", None), ("early_exit_sync", "graphs"): ("PK103", "pieces_speedup"),
    ("resnet18_pageable", "pinned"): ("PK104", None), ("resnet18_pageable", "channels_last_bf16"): ("PK305", "bf16_channels_last_speedup"),
    ("resnet18_pageable", "pinned+channels_last_bf16"): ("PK104+PK305", "bf16_channels_last_speedup"),
    ("lstm_cell_loop", "cuda_graph"): ("PK103", "cuda_graph_speedup"), ("lstm_cell_loop", "cudnn_lstm"): ("PK106", None),
    ("bert_fp32_infer", "tf32"): ("PK302", None), ("bert_fp32_infer", "bf16_autocast"): ("PK302", "bf16_speedup"),
    ("bert_fp32_infer", "cuda_graph"): ("PK103", "cuda_graph_speedup"),
    ("bert_b1_infer", "cuda_graph"): ("PK103", "cuda_graph_speedup"), ("bert_b1_infer", "compile"): ("PK103", "fusion_speedup"),
    # the static cache makes transformers compile the decode forward: fused, then (graphs) captured
    ("generate_llama", "static"): ("PK103", "compile_pieces_speedup"),
    ("generate_llama", "graphs"): ("PK103", "compile_pieces_speedup"),
    ("dataloader_cnn", "workers_pin"): ("PK102", None),
    ("numpy_aug_train", "workers"): ("PK102", None), ("numpy_aug_train", "gpu_aug"): ("PK102", None),
    ("mlp_train_big", "cuda_graph"): ("PK103", "cuda_graph_speedup"), ("mlp_train_big", "fused_adamw"): ("PK201", None),
    ("mlp_train_big", "compile"): ("PK103", "fusion_speedup"), ("resnet50_train", "compile"): ("PK103", "fusion_speedup"),
    ("resnet50_train", "compile_graphs"): ("PK103", "compile_speedup"),
    ("compiled_gpt_train", "reduce_overhead"): ("PK103", "cuda_graph_speedup"),
    ("compiled_gpt_train", "fused_adamw"): ("PK201", None),
    ("graphed_encoder_infer", "pinned"): ("PK104", None), ("graphed_encoder_infer", "tf32"): ("PK302", None),
    ("resnet50_train", "fused_sgd"): ("PK201", None), ("resnet50_train", "cudnn_benchmark"): (None, None),
    ("handwritten_block_train", "compile"): ("PK103", "fusion_speedup"),
    ("handwritten_block_train", "fused_adamw"): ("PK201", None),
    ("varlen_empty_cache", "no_empty_cache"): ("PK105", None), ("varlen_empty_cache", "expandable_segments"): (None, None),
    ("sync_loop", "graph"): ("PK103", "pieces_speedup"),
    ("gpt2_fp32_train", "tf32"): ("PK302", None), ("gpt2_fp32_train", "bf16_autocast"): ("PK302", "bf16_speedup"),
    ("gpt2_fp32_train", "fused_adamw"): ("PK201", None),
    ("sync_loop", "no_sync"): ("PK101", None),
    ("vit_fp32_infer", "tf32"): ("PK302", None), ("vit_fp32_infer", "bf16_autocast"): ("PK302", "bf16_speedup"),
    # the CNN inference programs (w_resnet50_fp32_infer.py): PK305's two fixes and PK302's TF32
    **{(name, fix): ("PK305", f"{fix}_speedup") if fix != "tf32" else ("PK302", None)
       for name in CNN_INFERENCE for fix in ("channels_last", "bf16_channels_last", "tf32")},
    ("resnet18_fp32_train", "channels_last"): ("PK305", "channels_last_speedup"),
    ("resnet18_fp32_train", "bf16_channels_last"): ("PK305", "bf16_channels_last_speedup"), ("resnet18_fp32_train", "fused_sgd"): ("PK201", None),
    ("resnet50_fp32_train", "channels_last"): ("PK305", "channels_last_speedup"),
    ("resnet50_fp32_train", "bf16_channels_last"): ("PK305", "bf16_channels_last_speedup"),
    ("distilbert_finetune", "tf32"): ("PK302", None),
    ("distilbert_finetune", "bf16_autocast"): ("PK302", "bf16_speedup"),
    ("distilbert_finetune", "fused_adamw"): ("PK201", None), ("distilbert_finetune", "no_item"): ("PK101", None),
    ("convnext_tiny_fp32_train", "bf16_compile"): ("PK305+PK103", "bf16_channels_last_speedup"),
    ("swin_t_fp32_train", "tf32"): ("PK302", None), ("swin_t_fp32_train", "bf16_autocast"): ("PK302", "bf16_speedup"),
    ("swin_t_fp32_train", "compile"): ("PK103", "fusion_speedup"),
    ("t5_finetune", "tf32"): ("PK302", None), ("t5_finetune", "bf16_autocast"): ("PK302", "bf16_speedup"),
    ("t5_finetune", "fused_adamw"): ("PK201", None), ("t5_finetune", "no_item"): ("PK101", None),
    ("t5_finetune", "compile_graphs"): ("PK103", "compile_pieces_speedup"),
    ("resnet50_b4_infer", "cuda_graph"): ("PK103", "cuda_graph_speedup"),
    ("efficientnet_b0_b4_infer", "cuda_graph"): ("PK103", "cuda_graph_speedup"),
    ("mobilenet_v3_b4_infer", "cuda_graph"): ("PK103", "cuda_graph_speedup"),
    ("generate_qwen2", "static"): ("PK103", "compile_pieces_speedup"),
    ("generate_qwen2", "graphs"): ("PK103", "compile_pieces_speedup"),
}
