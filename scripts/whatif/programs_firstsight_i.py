"""Registry entries of what-if corpus programs of three kinds the corpus lacked, to be scored at
first sight (``pinn_burgers_train``: a physics-informed network whose loss takes second
derivatives by autograd, a third-order graph of tiny kernels; ``lamb_python_optim_train``: a
hand-written LAMB optimizer looping over the parameters, reading each trust ratio back;
``sliding_window_infer``: 3-D segmentation by sliding windows whose logits are accumulated in
numpy on the host), in the format of ``PROGRAMS`` in scripts/whatif/registry.py.

pays: True (expected > 1.05x), False (expected < 1.05x), None (not sure). The expectations were
written with the programs, before any run of them on a GPU: iteration times are estimates from
their FLOPs, bytes, launch counts and waits, not measurements.

Imports only what the registry's programs share (builders.py).
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "pinn_burgers_train", "family": "physics-informed network: derivatives by double backward",
        "script": f"{W}/w_pinn_burgers_train.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "graph": fix("graph", True, "the whole step (points, derivatives, loss, backward, capturable Adam) "
                                        "captured in one CUDA graph"),
            "fused_adam": fix("fused_adam", False, "Adam(fused=True)"),
            "tf32": fix("tf32", False, "torch.set_float32_matmul_precision('high')"),
        },
        "expect": {
            "baseline": "an 8 x 64 tanh MLP at 8,192 points: the forward, two derivative passes with "
                        "create_graph and the backward through them, ~600-800 kernels of 2-5 us each "
                        "(~2.5 ms of GPU work) issued at ~8-10 us each. Expected 6-8 ms a step, host-bound",
            "graph": "pays: the launches and the Python between them gone, the GPU's ~2.5 ms and the graph's "
                     "nodes left. Expected 2-3.5x",
            "fused_adam": "does not pay: ~10 foreach launches over 18 small parameters become one. "
                          "Expected 1.00-1.03x",
            "tf32": "does not pay: 64-wide GEMMs on a host-bound step. Expected 0.98-1.02x",
        },
    },
    {
        "name": "lamb_python_optim_train", "family": "a hand-written optimizer: LAMB in a Python loop",
        "script": f"{W}/w_lamb_python_optim_train.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "no_sync": fix("no_sync", True, "the trust ratio kept on the GPU: the loop's launches stay, no wait"),
            "foreach": fix("foreach", True, "LAMB over all parameters at once with torch._foreach_* ops"),
            "fused_adamw": fix("fused_adamw", True, "AdamW(fused=True) instead of LAMB (another algorithm)"),
        },
        "expect": {
            "baseline": "BERT-base at 32 x 128 tokens in bf16: ~2.1 TFLOP forward and backward (~7 ms of GPU "
                        "work); then 153 parameters a step, each ~12 launches and three waits for the GPU "
                        "(~120 us each on the host). Expected 20-30 ms a step, the optimizer's loop most of it",
            "no_sync": "pays: the loop's ~2,000 launches overlap the GPU's work instead of waiting on it; the "
                       "host's ~15 ms then sets the step. Expected 1.4-1.9x",
            "foreach": "pays: a few dozen launches for the update; the GPU's ~9 ms sets the step. "
                       "Expected 2-3x",
            "fused_adamw": "pays: one pass over the parameters, ~0.5 ms. Expected 2.5-3.5x",
        },
    },
    {
        "name": "sliding_window_infer", "family": "sliding-window 3-D segmentation accumulated on the host",
        "script": f"{W}/w_sliding_window_infer.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "infer", "kind": "inference", "interleave": "all", "rounds": 5,
        "fixes": {
            "gpu_accumulate": fix("gpu_accumulate", True, "the volume on the GPU, the windows' weighted logits "
                                                          "accumulated and the argmax taken there, uint8 labels "
                                                          "copied back"),
            "batched": fix("batched", None, "four windows a forward, the accumulation on the host kept"),
            "bf16": fix("bf16", False, "the network under bf16 autocast"),
        },
        "expect": {
            "baseline": "8 windows of 96^3 a volume: ~4 ms of 3-D convolutions each on the GPU, then 14 MB of "
                        "logits copied to pageable memory (~3 ms) and accumulated by numpy (~12 ms), and the "
                        "argmax over 4.1M voxels on the host (~40 ms). Expected 200-260 ms a volume, the CPU's "
                        "copies and numpy passes most of it",
            "gpu_accumulate": "pays: the accumulation and the argmax become GPU passes of milliseconds; the "
                              "network's ~32 ms sets the volume. Expected 4-7x",
            "batched": "unsure, small: two forwards instead of eight; the host's accumulation unchanged. "
                       "Expected 1.0-1.1x",
            "bf16": "does not pay: faster convolutions while the host's numpy sets the pace. "
                    "Expected 1.0-1.08x",
        },
    },
]
