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
    ("linear_probe_train", "channels_last"): "led to PK305's 16-bit NCHW branch (channels_last alone, priced by "
                                             "the transposes)",
    ("activation_offload_train", "no_offload"): "led to PK104's round trips (activations offloaded and brought back)",
    ("activation_offload_train", "pinned"): "led to PK104's round trips (activations offloaded and brought back)",
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
    ("padded_encoder_infer", "bf16"): "led to PK302's bf16 attention from the op record's SDPA shapes",
    ("tabular_mlp_train", "batched_fetch"): "led to PK102's timed row-by-row fetch",
    ("cpu_embedding_train", "gpu_table"): "led to PK109's host-tensor ops from the op record (this capture's record has none)",
    ("request_loop_infer", "batched"): "led to PK110 (requests run one at a time, each fed from the host and read back)",
    ("distill_teacher_train", "teacher_no_grad"): "led to the op record's unstepped parameters and PK206",
    ("ensemble_loop_train", "vmapped"): "led to PK107's models trained one after another (an optimizer in each copy)",
    ("gpu_augment_loop_train", "batched_augment"): "led to PK107's optional kernels and units of data work",
    ("lamb_python_optim_train", "no_sync"): "led to PK101 pricing its two fixes apart (the values kept on the "
                                            "GPU with the loop kept, and read together)",
    ("masked_sdpa_train", "is_causal"): "led to the op record's causal mask tensors and PK301's is_causal",
    ("gru_rollout_infer", "cudnn_encoder"): "led to PK106's plain stretches of a loop whose other steps are not a recurrence",
    ("gru_rollout_infer", "bf16"): "led to PK302's bf16 charging no cast to a recurrent loop's GEMMs",
    ("wgan_gp_train", "bf16"): "led to autocast's cast cost per kernel re-fitted on the corpus's bf16 pairs "
                               "(PK302's cast_cpu_us, 37 to 30 us)",
    ("vae_distributions_train", "no_validate_graph"): "led to the compile trials saying which of the program's "
                                                      "modules they left out, which then rank nothing below "
                                                      "the model's price",
    ("int8_dequant_infer", "bf16_weights"): "led to the op record's loop-invariant ops and PK207 (work "
                                            "recomputed every call from weights that never change)",
    ("nerf_chunks_infer", "big_chunks"): "led to the op record's outermost module calls and PK107's loops "
                                         "over the chunks of one batch",
    ("cfg_two_pass_sample", "batched_cfg"): "led to the op record's calls on one input and PK107's one call on both",
    ("detr_matching_train", "batched_cost"): "led to PK107 searching loop bodies of up to 256 kernels (its "
                                             "matcher's 50), and to a unit of an optimizer's kernels alone "
                                             "left to PK201",
    ("global_prune_train", "sort_threshold"): "led to PK307 (a long kernel on a few blocks) and the op table's "
                                              "fusion bound at the call's longest kernel",
    ("ssm_scan_infer", "bf16"): "led to PK302 charging autocast's casts to GEMV kernels",
    ("fp64_surrogate_train", "fp32"): "led to PK306 (float64 compute) and the fp32 switch",
    ("fp64_surrogate_train", "fp32_tf32"): "led to PK306 (float64 compute) and the fp32 switch",
    ("fp64_surrogate_train", "fp32_bf16"): "led to PK306 (float64 compute) and the fp32 switch",
    ("encoder_grad_on_infer", "inference_mode"): "led to classify's notice of inference with autograd left on "
                                                 "and the inference_mode trial (unpriced by the model)",
    ("mobilenet_v3_fp32_infer", "freeze_compile"): "led to PK403's layout and its fusion of every run between "
                                                   "library kernels",
    ("regnet_y_800mf_fp32_infer", "freeze_compile"): "led to PK403's layout and its fusion of every run between "
                                                     "library kernels",
    ("weight_streaming_infer", "resident"): "led to PK104's streamed weights (kept on the GPU where they fit)",
}


def role(prog: str, fix: str) -> str:
    """What the pair is evidence of: "built on", "no test", "first sight" (a program of
    programs_firstsight_*.py, scored the first time profkit saw it: firstsight.py) or "test"
    (see BUILT_ON, NO_TEST)."""
    from .registry import PROGRAMS
    if prog in BUILT_ON:
        return "built on"
    if (prog, fix) in NO_TEST:
        return "no test"
    return "first sight" if any(p["name"] == prog and p.get("first_sight") for p in PROGRAMS) else "test"


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
    # The first-sight programs (programs_firstsight_*.py): which rule proposes each fix, written
    # with the programs, before their first capture, by what the fix does (a sync kept on the GPU:
    # PK101; workers or prepared data: PK102; graphs and compile: PK103, by the variant; a copy:
    # PK104; a fused optimizer: PK201; a precision: PK302; a memory format: PK305; SDPA: PK301).
    # A fix no rule proposes (sparse gradients, a CSR matmul, bigger micro-batches, a batched
    # tokenizer) is priced 1.00x. A loop vectorised (a per-sample loss, an EMA over the parameters
    # with torch._foreach_*) is PK107's, checkpointing left off PK204's: rules written after these
    # programs and before their first capture.
    ("recsys_embbag_train", "fused_adam"): ("PK201", None), ("recsys_embbag_train", "sparse"): (None, None),
    ("recsys_embbag_train", "bf16"): ("PK302", "bf16_speedup"),
    # fixed capacity: the experts' loop batched (PK107) and its nonzero syncs gone (PK101), together
    ("moe_routing_train", "capacity"): ("PK101+PK107", None), ("moe_routing_train", "compile"): ("PK103", "fusion_speedup"),
    ("moe_routing_train", "fused_adamw"): ("PK201", None),
    ("kv_decode_sampling", "prealloc"): (None, None), ("kv_decode_sampling", "check_every_16"): ("PK101", None),
    ("kv_decode_sampling", "graph"): ("PK103", "pieces_speedup"),
    ("handwritten_attention_train", "sdpa"): ("PK301", None),
    ("handwritten_attention_train", "compile"): ("PK103", "fusion_speedup"),
    ("handwritten_attention_train", "fused_adamw"): ("PK201", None),
    ("eval_metrics_host", "argmax_gpu"): ("PK104", "reduce_on_gpu_speedup"),
    ("eval_metrics_host", "pinned"): ("PK104", "pinned_read_later_speedup"),
    ("eval_metrics_host", "metrics_gpu"): ("PK104", "reduce_on_gpu_speedup"),
    ("per_sample_loss_train", "vectorized"): ("PK107", None),
    ("per_sample_loss_train", "graph"): ("PK103", "cuda_graph_speedup"),
    ("per_sample_loss_train", "compile"): ("PK103", "fusion_speedup"),
    ("grad_accum_fp16_train", "bf16"): (None, None), ("grad_accum_fp16_train", "bigger_micro"): ("PK205", "to_2_speedup"),
    ("grad_accum_fp16_train", "no_item"): ("PK101", None), ("grad_accum_fp16_train", "fused_adamw"): ("PK201", None),
    # written before its capture, to judge PK205 (built on grad_accum_fp16_train) at first sight
    ("accum_resnet_train", "bigger_micro"): ("PK205", "to_2_speedup"),
    ("accum_resnet_train", "one_batch"): ("PK205", "to_1_speedup"),
    ("accum_resnet_train", "compile"): ("PK103", "fusion_speedup"),
    ("accum_resnet_train", "graph"): ("PK103", "cuda_graph_speedup"),
    # written before their captures (set e): the environment stepped on the host is the consumer
    # of each step's device-to-host copy of the actions, which PK104 prices moved to the GPU
    ("rl_rollout_train", "gpu_env"): ("PK104", "reduce_on_gpu_speedup"),
    ("rl_rollout_train", "more_envs"): (None, None), ("rl_rollout_train", "fused_adam"): ("PK201", None),
    ("padded_encoder_infer", "pad_to_longest"): (None, None),
    ("padded_encoder_infer", "sort_by_length"): (None, None),
    ("padded_encoder_infer", "bf16"): ("PK302", "bf16_speedup"), ("padded_encoder_infer", "tf32"): ("PK302", None),
    # written before their captures (set f): a teacher's backward no rule sees; LoRA's frozen fp32
    # weights recast by autocast (PK202); a loader's per-row fetch, whose workers PK102 prices
    # teacher_no_grad: PK206's, the rule its first-sight miss led to (a correction after first sight)
    ("distill_teacher_train", "teacher_no_grad"): ("PK206", None),
    ("distill_teacher_train", "fused_adamw"): ("PK201", None),
    ("distill_teacher_train", "compile"): ("PK103", "fusion_speedup"),
    ("lora_finetune_train", "bf16_base"): ("PK202", None),
    # PK103 prices the default mode's fusion on a GPU-paced step; this one is host-paced (its
    # finding prices the graphs of the pieces), and PK402 prices torch.compile's fusion: corrected
    # after its first sight (scored with PK103's, absent here: 1.00x)
    ("lora_finetune_train", "compile"): ("PK402", None),
    ("lora_finetune_train", "fused_adamw"): ("PK201", None),
    # (PK102 prices batched_fetch where the record timed the fetch: this capture's has no timing)
    # batched_fetch: PK102's since its fetch is timed at capture (a correction after first sight)
    ("tabular_mlp_train", "batched_fetch"): ("PK102", "batched_fetch_speedup"),
    ("tabular_mlp_train", "gpu_resident"): (None, None),
    ("tabular_mlp_train", "workers"): ("PK102", None),
    # written before their captures (set g): the backward's NaN checks are waits PK101 removes (the
    # stacks anomaly mode takes, no rule sees); a request loop vectorised is PK107's, its per-request
    # read PK101's, torch.compile's fusion on a host-paced step PK402's; a table moved to the GPU no rule's
    ("anomaly_debug_train", "anomaly_off"): (None, None), ("anomaly_debug_train", "check_nan_off"): ("PK101", None),
    ("anomaly_debug_train", "fused_adamw"): ("PK201", None),
    # batched: PK110's, the rule its first-sight miss led to (a correction after first sight)
    ("request_loop_infer", "batched"): ("PK110", None), ("request_loop_infer", "no_item"): ("PK101", None),
    ("request_loop_infer", "compile"): ("PK402", None),
    # gpu_table: PK109's, the rule its first-sight miss led to (a correction after first sight)
    ("cpu_embedding_train", "gpu_table"): ("PK109", None), ("cpu_embedding_train", "fused_adam"): ("PK201", None),
    ("cpu_embedding_train", "compile"): ("PK402", None),
    # written before their captures (set h): an ensemble's loop over its members and a per-image
    # augmentation loop are repeated units PK107 vectorises, their optimizers PK201's, fusion PK402's,
    # channels_last PK305's; SDPA's masked kernels against its causal flash ones no rule's
    ("ensemble_loop_train", "vmapped"): ("PK107", None), ("ensemble_loop_train", "one_backward"): (None, None),
    ("ensemble_loop_train", "fused_adamw"): ("PK201", None),
    # is_causal: PK301's, since the op record tells a causal mask tensor apart (a correction after
    # first sight, shown on the recapture)
    ("masked_sdpa_train", "is_causal"): ("PK301", None), ("masked_sdpa_train", "compile"): ("PK402", None),
    ("masked_sdpa_train", "fused_adamw"): ("PK201", None),
    ("gpu_augment_loop_train", "batched_augment"): ("PK107", None), ("gpu_augment_loop_train", "compile"): ("PK402", None),
    ("gpu_augment_loop_train", "channels_last"): ("PK305", None),
    # written before their captures (set i): a whole step graphed is PK103's, a fused optimizer
    # PK201's, TF32 PK302's; a hand-written optimizer's waits PK101's, its loop vectorised PK107's,
    # a library optimizer in its place PK201's; a host accumulation moved to the GPU no rule's
    # (PK101 removes a copy's wait, not the numpy after it), a window batch PK107's, bf16 PK305's
    ("pinn_burgers_train", "graph"): ("PK103", "cuda_graph_speedup"), ("pinn_burgers_train", "fused_adam"): ("PK201", None),
    ("pinn_burgers_train", "tf32"): ("PK302", None),
    # no_sync keeps the loop: PK101's price of the values kept on the GPU, which it prices apart
    # since this program (a correction after first sight: scored with its headline, read together)
    ("lamb_python_optim_train", "no_sync"): ("PK101", "kept_on_gpu_speedup"), ("lamb_python_optim_train", "foreach"): ("PK107", None),
    ("lamb_python_optim_train", "fused_adamw"): ("PK201", None),
    # gpu_accumulate: PK104's device-to-host consumer ("reduce on the GPU, copy the result"), which
    # the entry written before the capture had given to no rule (corrected after first sight: the
    # first-sight record keeps the score as registered)
    ("sliding_window_infer", "gpu_accumulate"): ("PK104", None), ("sliding_window_infer", "batched"): ("PK107", None),
    ("sliding_window_infer", "bf16"): ("PK305", None),
    # written before their captures (set j): similarities ranked on the host are PK104's device-to-
    # host consumer (its pinned variant too), a bf16 GEMM PK302's; a rollout graphed is PK103's,
    # an encoder of cells put on cuDNN PK106's, bf16 autocast PK302's; a schedule looked up on the
    # host and a logged loss are PK101's waits, bf16 and channels_last convolutions PK305's (its
    # bf16 price is with channels_last: the nearest to bf16 alone)
    ("knn_retrieval_infer", "gpu_topk"): ("PK104", None),
    ("knn_retrieval_infer", "pinned"): ("PK104", "pinned_speedup"), ("knn_retrieval_infer", "bf16"): ("PK302", "bf16_speedup"),
    ("gru_rollout_infer", "graph"): ("PK103", "cuda_graph_speedup"), ("gru_rollout_infer", "cudnn_encoder"): ("PK106", None),
    ("gru_rollout_infer", "bf16"): ("PK302", "bf16_speedup"),
    ("ddpm_cpu_schedule_train", "gpu_schedule"): ("PK101", None),
    ("ddpm_cpu_schedule_train", "bf16"): ("PK305", "bf16_channels_last_speedup"),
    ("ddpm_cpu_schedule_train", "channels_last"): ("PK305", "channels_last_speedup"),
    # written before their captures (set k): TF32 and bf16 GEMMs are PK302's, a fused optimizer
    # PK201's, masks built on the GPU no rule's (small pageable copies); the distributions' checks
    # are PK101's waits, the step graphed once they are gone PK103's whole-step graph; bf16 and
    # channels_last convolutions PK305's (its bf16 price is with channels_last: the nearest to
    # bf16 alone), a logged estimate PK101's
    ("seq2seq_transformer_train", "tf32"): ("PK302", None), ("seq2seq_transformer_train", "bf16"): ("PK302", "bf16_speedup"),
    ("seq2seq_transformer_train", "gpu_masks"): (None, None), ("seq2seq_transformer_train", "fused_adam"): ("PK201", None),
    ("vae_distributions_train", "no_validate"): ("PK101", None),
    # no_validate_graph removes the checks' waits and graphs the whole step: PK101's and PK103's
    # edits replayed at once (a correction after first sight: registered as PK103's whole-step
    # graph, which the harness reads as refused while the waits stand)
    ("vae_distributions_train", "no_validate_graph"): ("PK101+PK103", None),
    ("vae_distributions_train", "fused_adam"): ("PK201", None),
    ("wgan_gp_train", "bf16"): ("PK305", "bf16_channels_last_speedup"),
    ("wgan_gp_train", "channels_last"): ("PK305", "channels_last_speedup"),
    ("wgan_gp_train", "no_item"): ("PK101", None), ("wgan_gp_train", "fused_adam"): ("PK201", None),
    # written before their captures (set l): beams selected on the GPU remove PK101's waits (its
    # loop of reads: the candidates walked in Python), torch.compile of a host-paced step is
    # PK402's; TF32 and bf16 GEMMs PK302's, the attention's explicit path PK301's, a fused
    # optimizer PK201's; weights kept in bf16 no rule's (a dequantization no rule names),
    # torch.compile's fusion of the dequantization PK402's, a CUDA graph PK103's
    ("beam_search_decode", "gpu_beams"): ("PK101", None), ("beam_search_decode", "compile"): ("PK402", None),
    ("mae_pretrain_train", "tf32"): ("PK302", None), ("mae_pretrain_train", "bf16"): ("PK302", "bf16_speedup"),
    ("mae_pretrain_train", "sdpa"): ("PK301", None), ("mae_pretrain_train", "fused_adamw"): ("PK201", None),
    ("int8_dequant_infer", "bf16_weights"): ("PK207", None), ("int8_dequant_infer", "compile"): ("PK402", None),
    ("int8_dequant_infer", "graph"): ("PK103", "cuda_graph_speedup"),
    ("vocoder_weightnorm_infer", "fold_weight_norm"): ("PK207", None),
    ("vocoder_weightnorm_infer", "tf32"): ("PK305", None), ("vocoder_weightnorm_infer", "compile"): ("PK402", None),
    ("encoder_grad_on_infer", "inference_mode"): (None, None),
    ("encoder_grad_on_infer", "bf16"): ("PK302", "bf16_speedup"),
    ("encoder_grad_on_infer", "bf16_inference"): ("PK302", "bf16_speedup"),
    ("nerf_chunks_infer", "big_chunks"): ("PK107", None), ("nerf_chunks_infer", "tf32"): ("PK302", None),
    ("nerf_chunks_infer", "compile"): ("PK402", None),
    # written before their captures (set n): a model called twice a step where one call on both
    # halves would do is PK107's repeated unit (the calls vectorised), a CUDA graph PK103's, bf16
    # GEMMs PK302's; float64 turned float32 no rule's (TF32 alone is PK302's, and leaves float64
    # GEMMs as they are); a scan's Python loop over tokens done in chunks is PK107's unit of the
    # loop vectorised, the forward graphed PK103's
    ("cfg_two_pass_sample", "batched_cfg"): ("PK107", None),
    ("cfg_two_pass_sample", "graph"): ("PK103", "cuda_graph_speedup"),
    ("cfg_two_pass_sample", "bf16"): ("PK302", "bf16_speedup"),
    # (float32 is PK306's since its first sight: the three were no rule's when first scored)
    ("fp64_surrogate_train", "fp32"): ("PK306", "fp32_speedup"), ("fp64_surrogate_train", "fp32_tf32"): ("PK306", None),
    ("fp64_surrogate_train", "fp32_bf16"): ("PK306", "bf16_speedup"), ("fp64_surrogate_train", "tf32"): ("PK302", None),
    ("ssm_scan_infer", "chunked_scan"): ("PK107", None),
    ("ssm_scan_infer", "graph"): ("PK103", "cuda_graph_speedup"),
    ("ssm_scan_infer", "bf16"): ("PK302", "bf16_speedup"),
    # written before their captures (set o): offloaded activations through pinned buffers are
    # PK104's pageable copies pinned; no offload, or checkpointing instead, no rule's; bf16 PK302's.
    # Negatives drawn in Python on the main thread: the host work between the GPU's steps is
    # PK102's (the main process prepares the batch while the GPU idles), drawn on the GPU or with
    # NumPy alike; fused Adam PK201's. LBFGS's host reads of its recursion's coefficients are
    # waits inside the step, PK101's to remove; a shorter history no rule's; bf16 and channels_last
    # for its convolutions PK305's
    ("activation_offload_train", "pinned"): ("PK104", "pinned_speedup"),
    ("activation_offload_train", "checkpoint"): (None, None),
    # (after its first sight: PK104 names the round trip and prices the offload dropped)
    ("activation_offload_train", "no_offload"): ("PK104", None),
    ("activation_offload_train", "bf16"): ("PK302", "bf16_speedup"),
    ("kge_negative_sampling_train", "gpu_sampling"): ("PK102", None),
    ("kge_negative_sampling_train", "numpy_sampling"): ("PK102", None),
    ("kge_negative_sampling_train", "fused_adam"): ("PK201", None),
    ("lbfgs_style_transfer", "gpu_two_loop"): ("PK101", None),
    ("lbfgs_style_transfer", "history10"): (None, None),
    ("lbfgs_style_transfer", "bf16"): ("PK305", None),
    ("lbfgs_style_transfer", "channels_last"): ("PK305", None),
    # written before their captures (set p): the attention weights nn.MultiheadAttention computes
    # by default are the math path PK301 names (SDPA instead); torch.compile's fusion PK402's;
    # fused AdamW PK201's. Deterministic index_add_ (the reproducibility settings) no rule's; TF32
    # PK302's. An optimizer step split into one group per parameter is host time in the
    # optimizer, PK201's (fewer, fused passes), grouped or fused alike
    ("vit_mha_weights_train", "need_weights_false"): ("PK301", None),
    ("vit_mha_weights_train", "compile"): ("PK402", None),
    ("vit_mha_weights_train", "fused_adamw"): ("PK201", None),
    ("deterministic_mesh_train", "nondeterministic"): (None, None),
    ("deterministic_mesh_train", "sorted_segments"): (None, None),
    ("deterministic_mesh_train", "tf32"): ("PK302", None),
    ("llrd_param_groups_finetune", "grouped"): ("PK201", None),
    ("llrd_param_groups_finetune", "fused_adamw"): ("PK201", None),
    ("llrd_param_groups_finetune", "grouped_fused"): ("PK201", None),
    # written before their captures (set q): cuDNN's benchmark mode (off, or a few padded lengths)
    # no rule's; bf16 convolutions PK305's. One batched backward for the exact divergence's 32 is
    # the vectorised loop PK107 names; Hutchinson's estimator (another objective) no rule's; TF32
    # PK302's. DGCNN's edge chain fused by torch.compile PK402's, its bf16 PK305's (1x1
    # convolutions), TF32 for its matmuls PK302's
    ("varlen_conv_benchmark_train", "no_benchmark"): (None, None),
    ("varlen_conv_benchmark_train", "bucketed"): (None, None),
    ("varlen_conv_benchmark_train", "bf16"): ("PK305", None),
    ("cnf_exact_divergence_train", "batched_grads"): ("PK107", None),
    ("cnf_exact_divergence_train", "hutchinson"): (None, None),
    ("cnf_exact_divergence_train", "tf32"): ("PK302", None),
    # torch.compile(model), default mode: PK103's fusion price, as for the other programs' compile
    # (mapped to PK402, which did not fire, when the program was scored at first sight)
    ("dgcnn_knn_train", "compile"): ("PK103", "fusion_speedup"),
    ("dgcnn_knn_train", "bf16"): ("PK305", None),
    ("dgcnn_knn_train", "tf32"): ("PK302", None),
    # written before their captures (set r): TF32 for k-means' distances PK302's; reading the
    # convergence test less often PK101's; a one-hot GEMM for index_add_ no rule's. One stacked
    # head for forty the vectorised loop PK107 names, torch.compile of the loop PK402's (the fusion
    # of its elementwise work), fused AdamW PK201's. A float64 GP's float32 PK306's; cholesky_ex
    # (its host check gone) PK101's
    ("kmeans_lloyd_loop", "tf32"): ("PK302", None),
    ("kmeans_lloyd_loop", "check_every_10"): ("PK101", None),
    ("kmeans_lloyd_loop", "matmul_update"): (None, None),
    ("multitask_heads_train", "stacked_heads"): ("PK107", None),
    ("multitask_heads_train", "compile"): ("PK402", None),
    ("multitask_heads_train", "fused_adamw"): ("PK201", None),
    # float32 alone, no TF32 (the program's fix): PK306's fp32_speedup, as for fp64_surrogate_train;
    # mapped to its TF32 price when the program was scored at first sight
    ("gp_cholesky_train", "fp32"): ("PK306", "fp32_speedup"),
    ("gp_cholesky_train", "cholesky_ex"): ("PK101", None),
    # written before their captures (set s): the FNO's TF32 PK302's, its bf16 autocast PK305's for the
    # convolutions (PK302's where none is priced), torch.compile PK103's fusion. The TorchScript
    # encoder's CUDA graph PK103's graph, torch.compile instead of the script PK103's fusion, eager
    # (the script dropped) no rule's
    ("fno_spectral_train", "tf32"): ("PK302", None),
    ("fno_spectral_train", "bf16"): ("PK305", None),
    ("fno_spectral_train", "compile"): ("PK103", "fusion_speedup"),
    ("torchscript_mlp_infer", "graph"): ("PK103", "cuda_graph_speedup"),
    ("torchscript_mlp_infer", "compile"): ("PK103", "fusion_speedup"),
    ("torchscript_mlp_infer", "eager"): (None, None),
    # (QAT: fusing the modules and freezing the observers no rule's; torch.compile PK103's fusion)
    ("qat_fakequant_train", "fused_modules"): (None, None),
    ("qat_fakequant_train", "freeze_observers"): (None, None),
    ("qat_fakequant_train", "compile"): ("PK103", "fusion_speedup"),
    # written before their captures (set t): the segmentation network's bf16 PK305's for its
    # convolutions (with channels_last its bf16_channels_last price), torch.compile PK103's fusion,
    # TF32 PK302's. The packed LSTM's host lengths remove PK101's wait; bucketed lengths (less
    # padding) and the LSTM run over the padding instead of packing no rule's; bf16 for the head's
    # GEMMs PK302's. The LLM's loss on the bf16 logits is what PK203 prices (no float32 logits);
    # the loss in chunks that still upcast each one no rule's (PK203 prices the upcast gone);
    # torch.compile PK103's fusion, fused AdamW PK201's
    ("segmentation_deeplab_train", "bf16"): ("PK305", None),
    ("segmentation_deeplab_train", "channels_last_bf16"): ("PK305", "bf16_channels_last_speedup"),
    ("segmentation_deeplab_train", "compile"): ("PK103", "fusion_speedup"),
    ("segmentation_deeplab_train", "tf32"): ("PK302", None),
    ("packed_lstm_lm_train", "cpu_lengths"): ("PK101", None),
    ("packed_lstm_lm_train", "sorted_buckets"): (None, None),
    ("packed_lstm_lm_train", "no_pack"): (None, None),
    ("packed_lstm_lm_train", "bf16"): ("PK302", "bf16_speedup"),
    ("llama_bigvocab_loss_train", "bf16_loss"): ("PK203", None),
    ("llama_bigvocab_loss_train", "chunked_loss"): (None, None),
    ("llama_bigvocab_loss_train", "compile"): ("PK103", "fusion_speedup"),
    ("llama_bigvocab_loss_train", "fused_adamw"): ("PK201", None),
    # set u (written before its captures): Shampoo's roots every 10th step PK208's (written after
    # its first sight: no rule's then), the batched eigh no rule's, TF32 PK302's; the BiLSTM-CRF's
    # compiled loss PK103's fusion, its CUDA graph PK103's graph, bf16 PK302's; Faster R-CNN's TF32
    # and bf16 PK302's, fewer proposals no rule's
    ("shampoo_precond_train", "every_10"): ("PK208", None),
    ("shampoo_precond_train", "batched_eigh"): (None, None),
    ("shampoo_precond_train", "tf32"): ("PK302", None),
    ("bilstm_crf_train", "compile"): ("PK103", "fusion_speedup"),
    ("bilstm_crf_train", "graph"): ("PK103", "cuda_graph_speedup"),
    ("bilstm_crf_train", "bf16"): ("PK302", "bf16_speedup"),
    ("fasterrcnn_train", "tf32"): ("PK302", None),
    ("fasterrcnn_train", "bf16"): ("PK302", "bf16_speedup"),
    ("fasterrcnn_train", "fewer_proposals"): (None, None),
    # set v (written before its captures): the speculative decoder's accepted count read once a
    # round PK101's (its per-proposal waits), the static caches no rule's (as kv_decode_sampling's
    # prealloc), 8 proposals a round no rule's (the algorithm's), torch.compile PK103's fusion;
    # RAFT's fewer iterations no rule's, bf16 PK305's for its convolutions (with channels_last
    # its bf16_channels_last price), torch.compile PK103's fusion; MoCo's foreach moving average
    # PK107's (a loop over parameters, as ema_timm_train's), the queue's pointer on the host
    # PK101's, channels_last with bf16 PK305's, fused SGD PK201's
    ("speculative_decode_infer", "accept_on_gpu"): ("PK101", None),
    ("speculative_decode_infer", "static_cache"): (None, None),
    ("speculative_decode_infer", "draft_k8"): (None, None),
    ("speculative_decode_infer", "compile"): ("PK103", "fusion_speedup"),
    ("raft_flow_train", "fewer_iters"): (None, None),
    ("raft_flow_train", "bf16"): ("PK305", None),
    ("raft_flow_train", "channels_last_bf16"): ("PK305", "bf16_channels_last_speedup"),
    ("raft_flow_train", "compile"): ("PK103", "fusion_speedup"),
    ("moco_queue_train", "foreach_momentum"): ("PK107", None),
    ("moco_queue_train", "host_pointer"): ("PK101", None),
    ("moco_queue_train", "channels_last_bf16"): ("PK305", "bf16_channels_last_speedup"),
    ("moco_queue_train", "fused_sgd"): ("PK201", None),
    # set w (written before its captures): the neural ODE's step control on the GPU PK101's (its
    # per-attempt waits, the decision taken by torch.where), a fixed-step RK4 no rule's (another
    # method: no error control), the ODE function compiled PK103's fusion, bf16 PK302's for its
    # GEMMs; DETR's costs computed together and read once PK101's (values read in a loop, read
    # together), a greedy matcher on the GPU no rule's (another matching), bf16 PK302's, fused
    # AdamW PK201's; the mining loop's nonzero waits vectorised away PK101's (its reads computed
    # together, the loop's body gone), torch.compile PK103's fusion, channels_last with bf16
    # PK305's, fused AdamW PK201's
    ("neural_ode_adaptive_train", "fixed_rk4"): (None, None),
    ("neural_ode_adaptive_train", "gpu_control"): ("PK101", None),
    ("neural_ode_adaptive_train", "compile"): ("PK103", "fusion_speedup"),
    ("neural_ode_adaptive_train", "bf16"): ("PK302", "bf16_speedup"),
    # (DETR's batched cost: PK107's since its first sight, whose 50-kernel matching body, once
    # per decoder layer and image, a search of units up to 40 kernels had not seen)
    ("detr_matching_train", "batched_cost"): ("PK107", None),
    ("detr_matching_train", "gpu_greedy"): (None, None),
    ("detr_matching_train", "bf16"): ("PK302", "bf16_speedup"),
    ("detr_matching_train", "fused_adamw"): ("PK201", None),
    ("metric_mining_train", "vectorised_mining"): ("PK101", None),
    ("metric_mining_train", "compile"): ("PK103", "fusion_speedup"),
    ("metric_mining_train", "channels_last_bf16"): ("PK305", "bf16_channels_last_speedup"),
    ("metric_mining_train", "fused_adamw"): ("PK201", None),
    # set x (written after its captures, before its first score, by the convention above alone):
    # SAM's ascent and restore as torch._foreach_* ops PK107's (a loop over the parameters
    # vectorised), channels_last with bf16 PK305's, fused SGD PK201's, torch.compile PK103's
    # fusion; the pruning threshold from a sort no rule's (another algorithm for the same op), the
    # threshold every 100th step PK208's (per-step work done every N steps), fused AdamW PK201's,
    # torch.compile PK103's fusion; PixelCNN's CUDA graph PK103's graph, compile with graphs
    # PK103's, bf16 on its convolutions PK305's
    ("sam_wrn_train", "foreach_sam"): ("PK107", None),
    ("sam_wrn_train", "channels_last_bf16"): ("PK305", "bf16_channels_last_speedup"),
    ("sam_wrn_train", "fused_sgd"): ("PK201", None),
    ("sam_wrn_train", "compile"): ("PK103", "fusion_speedup"),
    # (the sort: PK307's since its first sight, a rule written after it: the selection's one block)
    ("global_prune_train", "sort_threshold"): ("PK307", None),
    ("global_prune_train", "every_100"): ("PK208", None),
    ("global_prune_train", "fused_adamw"): ("PK201", None),
    ("global_prune_train", "compile"): ("PK103", "fusion_speedup"),
    ("pixelcnn_sample_infer", "graph"): ("PK103", "cuda_graph_speedup"),
    ("pixelcnn_sample_infer", "compile_graphs"): ("PK103", "compile_speedup"),
    ("pixelcnn_sample_infer", "bf16"): ("PK305", "bf16_channels_last_speedup"),
    # set y (written before its captures, by the convention above): the R-GCN's relations batched
    # PK101+PK107's (a loop vectorised, its nonzero waits gone with it), bf16 PK302's, compile
    # PK103's fusion, fused Adam PK201's; DP-SGD's per-sample loop vectorised (vmap) PK107's, the
    # whole step graphed PK103's graph, bf16 on its convolutions PK305's; the L2 penalty moved into
    # Adam's weight decay PK107's (a loop over the parameters done by multi-tensor kernels),
    # compile PK103's fusion, fused Adam PK201's
    ("rgcn_relations_train", "batched_relations"): ("PK101+PK107", None),
    ("rgcn_relations_train", "bf16"): ("PK302", "bf16_speedup"),
    ("rgcn_relations_train", "compile"): ("PK103", "fusion_speedup"),
    ("rgcn_relations_train", "fused_adam"): ("PK201", None),
    ("dpsgd_loop_train", "vmap_grads"): ("PK107", None),
    ("dpsgd_loop_train", "graph"): ("PK103", "cuda_graph_speedup"),
    ("dpsgd_loop_train", "bf16"): ("PK305", "bf16_channels_last_speedup"),
    ("explicit_l2_train", "adam_weight_decay"): ("PK107", None),
    ("explicit_l2_train", "compile"): ("PK103", "fusion_speedup"),
    ("explicit_l2_train", "fused_adam"): ("PK201", None),
    # set z (written before its captures, by the convention above): the parametrization cached
    # for the step PK207's (a tensor derived from weights recomputed while they do not change),
    # bf16 PK302's, fused Adam PK201's; the probe's backbone frozen PK206's (gradients no optimizer
    # steps), channels_last PK305's, compile PK103's fusion; DINO's crops grouped by resolution
    # PK107's (a loop's repeated forwards batched), bf16 and channels_last PK305's
    ("orthogonal_rnn_train", "cached"): ("PK207", None),
    ("orthogonal_rnn_train", "bf16"): ("PK302", "bf16_speedup"),
    ("orthogonal_rnn_train", "fused_adam"): ("PK201", None),
    ("linear_probe_train", "frozen"): ("PK206", None),
    ("linear_probe_train", "channels_last"): ("PK305", "channels_last_speedup"),
    ("linear_probe_train", "compile"): ("PK103", "fusion_speedup"),
    ("multicrop_dino_train", "grouped"): ("PK107", None),
    ("multicrop_dino_train", "bf16"): ("PK305", None),
    ("multicrop_dino_train", "channels_last"): ("PK305", "channels_last_speedup"),
    ("multicrop_dino_train", "compile_reduce_overhead"): ("PK103", "compile_speedup"),
    ("mobilenet_v3_fp32_infer", "freeze_compile"): ("PK403", None),
    ("regnet_y_800mf_fp32_infer", "freeze_compile"): ("PK403", None),
    ("efficientnet_b0_fp32_infer", "freeze_compile"): ("PK403", None),
    ("resnet50_fp32_infer", "freeze_compile"): ("PK403", None),
    ("grad_checkpoint_train", "no_checkpointing"): ("PK204", None), ("grad_checkpoint_train", "fused_adamw"): ("PK201", None),
    # torch.compile(model) with the checkpointing kept: PK402's action (the chains' runs fused),
    # its top action at first sight
    ("grad_checkpoint_train", "compile"): ("PK402", None),
    # set za, named before their first capture: vectorising the tasks is PK107's; first-order MAML,
    # a KV cache and the head on the last position change the computation, which no rule proposes;
    # keeping streamed weights on the GPU neither (PK104 prices their copies from pinned memory)
    ("maml_inner_loop_train", "vmap_tasks"): ("PK107", None), ("maml_inner_loop_train", "first_order"): (None, None),
    ("maml_inner_loop_train", "bf16"): ("PK305", None),
    ("nocache_decode_infer", "kv_cache"): (None, None), ("nocache_decode_infer", "last_logits"): (None, None),
    ("nocache_decode_infer", "bf16"): ("PK302", "bf16_speedup"),
    # after its first sight: PK104 tells streamed weights (keep them on the GPU, its price; pinned
    # beside it)
    ("weight_streaming_infer", "pinned"): ("PK104", "pinned_speedup"),
    ("weight_streaming_infer", "prefetch"): ("PK104", "pinned_speedup"),
    ("weight_streaming_infer", "resident"): ("PK104", None),
    ("cpu_tokenize_infer", "encode_batch"): (None, None), ("cpu_tokenize_infer", "workers"): ("PK102", None),
    ("cpu_tokenize_infer", "pretokenized"): ("PK102", None),
    ("tuned_gpt_train", "reduce_overhead"): ("PK103", "cuda_graph_speedup"), ("tuned_gpt_train", "tf32"): ("PK302", None),
    ("tuned_gpt_train", "expandable_segments"): (None, None),
    # one mask, one batched NMS, one copy for the batch: the per-image loop vectorised (PK107)
    # and its syncs gone (PK101), both edits replayed at once
    ("detection_postproc_infer", "batched_nms"): ("PK101+PK107", None),
    ("detection_postproc_infer", "bf16_channels_last"): ("PK305", "bf16_channels_last_speedup"),
    ("detection_postproc_infer", "graph"): ("PK103", "pieces_speedup"),
    ("unet_diffusion_sample", "channels_last"): ("PK305", "channels_last_speedup"),
    ("unet_diffusion_sample", "sdpa"): ("PK301", None), ("unet_diffusion_sample", "graph"): ("PK103", "cuda_graph_speedup"),
    ("unet_diffusion_sample", "compile"): ("PK103", "fusion_speedup"),
    ("speech_conformer_train", "bf16"): ("PK302", "bf16_speedup"), ("speech_conformer_train", "fused_adamw"): ("PK201", None),
    ("speech_conformer_train", "compile"): ("PK103", "fusion_speedup"), ("speech_conformer_train", "sorted_lengths"): (None, None),
    ("gnn_scatter_train", "csr_spmm"): (None, None), ("gnn_scatter_train", "bf16"): ("PK302", "bf16_speedup"),
    ("gnn_scatter_train", "fused_adam"): ("PK201", None),
    ("video_r3d_train", "channels_last_3d"): ("PK305", "channels_last_speedup"),
    ("video_r3d_train", "bf16_channels_last_3d"): ("PK305", "bf16_channels_last_speedup"),
    ("video_r3d_train", "cudnn_benchmark"): (None, None), ("video_r3d_train", "tf32"): ("PK302", None),
    ("item_loss_small_train", "no_item"): ("PK101", None),
    ("item_loss_small_train", "compile_graphs"): ("PK103", "compile_pieces_speedup"),
    ("item_loss_small_train", "graph"): ("PK103", "pieces_speedup"),
    ("d2h_logits_numpy", "argmax_gpu"): ("PK104", "reduce_on_gpu_speedup"),
    ("d2h_logits_numpy", "pinned"): ("PK104", "pinned_speedup"), ("d2h_logits_numpy", "half_copy"): (None, None),
    ("compiled_step_train", "reduce_overhead"): ("PK103", "cuda_graph_speedup"),
    ("compiled_step_train", "fused_adamw"): ("PK201", None),
    ("ema_timm_train", "foreach_ema"): ("PK107", None), ("ema_timm_train", "fused_adamw"): ("PK201", None),
    ("ema_timm_train", "bf16"): ("PK302", "bf16_speedup"),
    ("contrastive_clip_train", "clamp_on_gpu"): ("PK101", None), ("contrastive_clip_train", "bf16"): ("PK302", "bf16_speedup"),
    ("contrastive_clip_train", "fused_adamw"): ("PK201", None),
    # The data-parallel programs (programs_firstsight_c.py), written with them, before their first
    # capture: no_sync is what PK502 prices (the all-reduce rounds of the first micro-batches
    # gone); a bucket size is what PK501's action names (its price: the exposed all-reduce time
    # hidden under compute); a fused optimizer PK201. No rule prices bf16 compression of the
    # gradients (half the bytes), gradients as bucket views (no copy into the buckets) or DDP's
    # static graph: 1.00x.
    ("ddp_accum_train", "no_sync"): ("PK502", None), ("ddp_accum_train", "bucket_100mb"): ("PK501", None),
    ("ddp_accum_train", "fused_adamw"): ("PK201", None), ("ddp_accum_train", "bf16_compress"): (None, None),
    ("ddp_small_buckets_train", "default_buckets"): ("PK501", None),
    ("ddp_small_buckets_train", "gradient_as_bucket_view"): (None, None),
    ("ddp_small_buckets_train", "static_graph"): (None, None),
    ("ddp_small_buckets_train", "fused_adamw"): ("PK201", None),
}
