"""First-sight set W: a neural ODE classifier trained through a hand-written adaptive Dormand-Prince
solver whose accept/reject decision and next step are taken on the host after every attempt
(``neural_ode_adaptive_train``), DETR-style set prediction whose Hungarian matching builds and
copies each image's cost matrix to the host for every decoder layer (``detr_matching_train``)
and metric learning whose batch-hard triplet mining is a Python loop over the anchors with
``nonzero`` in it (``metric_mining_train``). Entries as in set A (programs_firstsight_a.py):
``pays`` and ``expect`` written with the programs, before any run on a GPU (the solver's attempt
counts were measured on the CPU at the full size, which the entries say).
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "neural_ode_adaptive_train", "family": "a neural ODE trained through an adaptive RK45 solver "
                                                     "whose step control reads every attempt's error on the host",
        "script": f"{W}/w_neural_ode_adaptive_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "fixed_rk4": fix("fixed_rk4", True, "a fixed-step RK4 of as many evaluations (19 steps, 76): no "
                                                "error control, no waits"),
            "gpu_control": fix("gpu_control", False, "the adaptive solver's accept/reject and next step on the GPU "
                                                     "(torch.where) over a fixed 20 attempts: no waits"),
            "compile": fix("compile", False, "torch.compile of the ODE function (the MLP)", compiles=True),
            "bf16": fix("bf16", False, "bf16 autocast over the forward and the loss"),
        },
        "expect": {
            "baseline": "batch 512, a 256-wide state, the MLP 256-512-512-256 at ~0.54 GFLOP an evaluation; the "
                        "solver takes 12-13 attempts from t = 0 to 3 at 1e-5 (measured on the CPU, full size, "
                        "none rejected): ~75 evaluations forward and as many backward, ~120 GFLOP of fp32 "
                        "GEMMs (~5 ms) and ~3,000 launches a step (~97 an attempt forward: six evaluations of "
                        "5 kernels, ~46 for the stages' term-by-term combinations, ~21 for the error norm; "
                        "~144 backward), each over a few hundred KB, with 12-13 waits. ~20 ms of host time "
                        "against ~11 ms of GPU. Expected 17-26 ms a step on an H100, host-bound",
            "fixed_rk4": "pays: the same number of evaluations (76 against ~75) in 19 RK4 steps of ~33 launches "
                         "forward instead of 12-13 attempts of ~97 (no error estimate, no control, fewer "
                         "combination terms); the backward shrinks less (~83 a step, ~1,600 against ~1,750) "
                         "and the GEMMs stay: ~2,200 launches a step against ~3,000, the GPU's ~10 ms then "
                         "close behind. Expected 1.25-1.6x",
            "gpu_control": "does not pay: the waits it removes cost little (the GPU keeps pace with the "
                           "launches, so each drains an almost empty queue), while 20 attempts are computed "
                           "instead of 12-13, forward and backward, each with ~14 more launches of control "
                           "arithmetic: ~5,100 launches and 1.6x the GEMMs. Expected 0.5-0.7x",
            "compile": "does not pay: the ODE function is called ~75 times a step, and each call of a compiled "
                       "graph costs the host ~150 us more than its eager operations in training (guards, "
                       "AOTAutograd's wrapper, its backward's node: analyses/compile_breaks.md, H100), ~11 ms "
                       "against the ~2-3 ms of launches and Python it saves (Inductor's GEMMs keep about as "
                       "many kernels as eager's five: bias and tanh move into pointwise kernels); the "
                       "combinations, the error norm and the waits stay eager. Expected 0.55-0.8x",
            "bf16": "does not pay, by far: the error estimate is a difference of two combinations of the "
                    "stages, which then carry bf16's rounding (~4e-3 relative) against a tolerance of 1e-5, so "
                    "the solver shrinks its steps: ~104-112 attempts a solve on the CPU at the full size "
                    "instead of 12, each with one more cast an evaluation. Expected 0.08-0.15x",
        },
    },
    {
        "name": "detr_matching_train", "family": "DETR-style set prediction: a Hungarian matching per image and "
                                               "decoder layer, each cost matrix copied to the host",
        "script": f"{W}/w_detr_matching_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "batched_cost": fix("batched_cost", True, "all 96 cost matrices in one batched computation, copied to "
                                                      "the host once, then matched image by image"),
            "gpu_greedy": fix("gpu_greedy", True, "a greedy matching of all matrices at once on the GPU (an "
                                                  "approximation of the Hungarian): no copy to the host"),
            "bf16": fix("bf16", False, "bf16 autocast over the forward and the loss (the costs in float32)"),
            "fused_adamw": fix("fused_adamw", False, "AdamW(fused=True)"),
        },
        "expect": {
            "baseline": "batch 16 of 256 x 256 images: the CNN backbone ~26 GFLOP forward (TF32 convolutions), "
                        "the 6-layer decoder over 100 queries and 256 memory tokens ~38 GFLOP of fp32 GEMMs "
                        "forward, ~200 GFLOP a step with the backward (~6-8 ms of GPU). On the host: 96 "
                        "matchings of ~50 launches each (softmax, gather, cdist, the GIoU's ~40 elementwise "
                        "kernels) ending in a wait and a Hungarian solve of 100 x 5-30 (~20-30 us in SciPy), "
                        "~650 launches and ~200 small index copies in the loss, ~425 forward and ~475 "
                        "backward in the model: ~6,400 launches and 96 waits, ~48 ms of host time. Expected "
                        "40-65 ms a step on an H100, host-bound",
            "batched_cost": "pays: the matching's ~4,800 launches and 96 waits become ~85 launches and one "
                            "wait (a 1.2 MB copy); the 96 solves and the loss's index copies stay (~4 ms and "
                            "~650 launches). ~19 ms of host time against ~8 ms of GPU. Expected 2.0-3.0x",
            "gpu_greedy": "pays most: no wait and no solve; ~30 rounds of ~16 launches over all 96 matrices "
                          "(~570 with the cost), and the loss's indices already on the GPU (no index copies; "
                          "the concatenations launch instead). ~15-18 ms of host time. Expected 2.3-3.5x",
            "bf16": "does not pay: the decoder's GEMMs halve on the GPU, which is not what the step waits on, "
                    "and autocast adds a cast at each GEMM's activations and the matcher's float32 copies. "
                    "Expected 0.93-1.02x",
            "fused_adamw": "does not pay: two groups of ~120 tensors, ~30 foreach launches against a few fused "
                           "ones, ~0.2 ms of a ~50 ms step. Expected 1.0-1.01x",
        },
    },
    {
        "name": "metric_mining_train", "family": "metric learning: batch-hard triplet mining by a Python loop over "
                                               "the anchors, nonzero in each",
        "script": f"{W}/w_metric_mining_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "vectorised_mining": fix("vectorised_mining", True, "the batch-hard loss by torch.cdist and masked "
                                                                "max and min over the batch: no loop, no nonzero"),
            "compile": fix("compile", False, "torch.compile(model) (the embedding network)", compiles=True),
            "channels_last_bf16": fix("channels_last_bf16", False, "model and images in torch.channels_last, "
                                                                   "bf16 autocast"),
            "fused_adamw": fix("fused_adamw", False, "AdamW(fused=True)"),
        },
        "expect": {
            "baseline": "a small ResNet at 64 x 64, ~0.51 GFLOP an image: ~65 GFLOP forward at batch 128, ~195 "
                        "with the backward in TF32 convolutions and BatchNorm passes over ~1.5 GB (~3.5-4.5 ms "
                        "of GPU; ~4.5-5.5 ms with the BatchNorm passes). The mining loop: 128 anchors of ~17 "
                        "launches and 3 waits (two nonzero, a boolean index) forward, ~2,200 launches and 384 "
                        "waits, and ~5,100 tiny kernels backward (each anchor's norms, max and min, and its "
                        "gathers scattered into a 128 x 128 gradient); ~50 ms of host time a step beside the "
                        "network's ~125 launches. Expected 45-75 ms a step on an H100, host-bound, the GPU "
                        "idle ~90% of it",
            "vectorised_mining": "pays most: the loop's ~7,300 launches and 384 waits become ~30; what is left "
                                 "is the network, ~2 ms of host time against ~5 ms of GPU. Expected 7-13x",
            "compile": "does not pay: Inductor fuses the network's BatchNorm and ReLU passes (~150 fewer "
                       "launches, ~1 ms of host time, less ~0.15 ms for the compiled graph's call) and its GPU "
                       "time falls, but the step waits on the mining loop, which stays eager. Expected "
                       "0.97-1.04x",
            "channels_last_bf16": "does not pay: NHWC bf16 convolutions halve the network's GPU time, which "
                                  "is hidden behind the loop's host time; autocast adds ~40 casts and the "
                                  "loop runs on float32 embeddings as before (F.normalize's norm is float32). "
                                  "Expected 0.97-1.02x",
            "fused_adamw": "does not pay: ~60 parameter tensors, a few foreach launches saved, ~0.1 ms of a "
                           "~45 ms step. Expected 1.0-1.01x",
        },
    },
]
