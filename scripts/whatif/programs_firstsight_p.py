"""Registry entries of what-if corpus programs of three kinds the corpus lacked, to be scored at
first sight (``vit_mha_weights_train``: a ViT whose ``nn.MultiheadAttention`` is called with its
default ``need_weights=True``; ``deterministic_mesh_train``: a mesh GNN trained with the
reproducibility settings left on; ``llrd_param_groups_finetune``: layer-wise learning-rate decay
as one optimizer group per parameter), in the format of ``PROGRAMS`` in
scripts/whatif/registry.py.

pays: True (expected > 1.05x), False (expected < 1.05x), None (not sure). The expectations were
written with the programs, before any run of them on a GPU: iteration times are estimates from
their FLOPs, bytes, launch counts and waits, not measurements.

Imports only what the registry's programs share (builders.py).
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "vit_mha_weights_train", "family": "nn.MultiheadAttention called with need_weights=True",
        "script": f"{W}/w_vit_mha_weights_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "need_weights_false": fix("need_weights_false", True, "need_weights=False: the module calls SDPA"),
            "compile": fix("compile", None, "torch.compile(model), the call unchanged", compiles=True),
            "fused_adamw": fix("fused_adamw", False, "AdamW(fused=True) (a control)"),
        },
        "expect": {
            "baseline": "~4.4 TFLOP of bf16 GEMMs (~11 ms) and, in each of 12 layers, 32 x 6 x 785 x 785 "
                        "scores written, soft-maxed in fp32, cast, averaged over heads, forward and back "
                        "(~5 GB a layer, ~20 ms). Expected 30-35 ms a step, memory-bound attention",
            "need_weights_false": "pays most: flash attention, no score matrix. Expected 2.3-3x",
            "compile": "unsure: Inductor fuses the softmax with its casts and may match the pattern to "
                       "SDPA. Expected 1.3-2x",
            "fused_adamw": "does not pay: 22M parameters, ~0.5 ms of foreach AdamW. Expected 1.01x",
        },
    },
    {
        "name": "deterministic_mesh_train", "family": "reproducibility settings left on (deterministic "
                                                    "index_add_)",
        "script": f"{W}/w_deterministic_mesh_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "nondeterministic": fix("nondeterministic", True, "use_deterministic_algorithms(False): "
                                                              "atomic index_add_"),
            "sorted_segments": fix("sorted_segments", None, "determinism kept, sums as segment_reduce "
                                                            "over a sort order computed once"),
            "tf32": fix("tf32", True, "TF32 for the fp32 MLPs, determinism kept"),
        },
        "expect": {
            "baseline": "~1.3 TFLOP of fp32 GEMMs without TF32 (~28 ms), ~50 GB of elementwise traffic "
                        "(~15 ms), 24 deterministic index_add_ of 357k rows (a sort and an ordered "
                        "accumulation each, ~0.4 ms). Expected 50-55 ms a step, GEMM-bound",
            "nondeterministic": "pays a little: atomic adds instead of 24 sorted accumulations. "
                                "Expected 1.1-1.4x",
            "sorted_segments": "unsure: no sort per call, but segment_reduce's kernel is not tuned. "
                               "Expected 0.9-1.3x",
            "tf32": "pays most: the GEMMs ~3x faster. Expected 1.4-1.7x",
        },
    },
    {
        "name": "llrd_param_groups_finetune", "family": "one optimizer parameter group per parameter",
        "script": f"{W}/w_llrd_param_groups_finetune.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "grouped": fix("grouped", True, "28 groups of the same settings, foreach kept"),
            "fused_adamw": fix("fused_adamw", True, "AdamW(fused=True), the 151 groups kept"),
            "grouped_fused": fix("grouped_fused", True, "28 groups and AdamW(fused=True)"),
        },
        "expect": {
            "baseline": "~2.4 TFLOP of bf16 GEMMs and their elementwise work (~9-10 ms of GPU); AdamW's "
                        "Python and ~12 kernels for each of 151 groups (~15-23 ms of host). Expected "
                        "20-25 ms a step, host-bound in the optimizer",
            "grouped": "pays: 28 foreach passes instead of 151. Expected 1.8-2.2x",
            "fused_adamw": "pays: one kernel a group, the Python per group kept. Expected 1.6-2x",
            "grouped_fused": "pays most: the GPU sets the pace. Expected 2-2.5x",
        },
    },
]
