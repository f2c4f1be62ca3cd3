"""First-sight set U: a second-order optimizer written by hand (``shampoo_precond_train``: an MLP
trained with Shampoo, eight 1024 x 1024 eigendecompositions a step), a tagger whose CRF loss is a
Python loop over the positions (``bilstm_crf_train``: cuDNN's BiLSTM, then the forward algorithm
one position at a time) and a two-stage detector trained as torchvision's reference script does
(``fasterrcnn_train``: Faster R-CNN with a MobileNetV3 FPN backbone, per-image Python in its RPN
and box head). Entries as in set A (programs_firstsight_a.py): ``pays`` and ``expect`` written
with the programs, before any run.
"""
from __future__ import annotations

from .builders import W, fix


PROGRAMS: list[dict] = [
    {
        "name": "shampoo_precond_train", "family": "a second-order optimizer written by hand: Shampoo's "
                                                 "eigendecompositions every step",
        "script": f"{W}/w_shampoo_precond_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "every_10": fix("every_10", True, "the roots recomputed every 10th step (statistics every step)"),
            "batched_eigh": fix("batched_eigh", False, "the eight factors decomposed in one batched eigh call"),
            "tf32": fix("tf32", False, "TF32 for float32 matmuls"),
        },
        "expect": {
            "baseline": "eight torch.linalg.eigh of 1024 x 1024 float32 a step (cuSOLVER syevd: its "
                        "tridiagonalisation is memory-bound BLAS-2 work, several ms each, and each reads its "
                        "convergence flags back to the host), beside ~80 GFLOP of float32 GEMMs (~1.5-2 ms "
                        "on CUDA cores). Expected 40-170 ms a step on an H100, the eigendecompositions over "
                        "90% of it",
            "every_10": "pays most: nine steps in ten skip the eigendecompositions, the tenth keeps them. "
                        "Expected 5-9x",
            "batched_eigh": "does not pay: for matrices over 32 wide cuSOLVER's batched path decomposes them one "
                            "after another; only seven host reads and launches go. Expected 0.98-1.08x",
            "tf32": "does not pay: the GEMMs are a few percent of the step; the eigendecompositions are not "
                    "matmuls. Expected 0.99-1.05x",
        },
    },
    {
        "name": "bilstm_crf_train", "family": "a BiLSTM-CRF tagger: the CRF's forward algorithm a Python loop "
                                            "over the positions",
        "script": f"{W}/w_bilstm_crf_train.py", "args": [], "capture_args": ["--steps", "40"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "compile": fix("compile", True, "torch.compile of the CRF's negative log-likelihood", compiles=True),
            "graph": fix("graph", True, "the whole step captured in one CUDA graph (Adam capturable)"),
            "bf16": fix("bf16", False, "bf16 autocast over the forward"),
        },
        "expect": {
            "baseline": "the CRF's two loops over 127 positions launch ~13 small kernels a position forward "
                        "(~1,650) and about as many backward, each over 64 x 17 x 17 values: ~25-35 ms of "
                        "Python and launches a step against ~5 ms of GPU work (cuDNN's two-layer BiLSTM over "
                        "64 x 128 tokens ~2-4 ms forward and backward). Expected 30-50 ms a step on an H100, "
                        "host-bound",
            "compile": "pays: Inductor fuses each position's ops into one or two kernels forward and backward, "
                       "launched from generated code; Dynamo unrolls the 127 positions (a long compile). "
                       "Expected 2.5-5x",
            "graph": "pays most: the step replays as one graph, its time the GPU's (~5-8 ms). Expected 4-7x",
            "bf16": "does not pay: the LSTM and the Linear were a small part of the step; the CRF's loop stays "
                    "as it was. Expected 0.95-1.05x",
        },
    },
    {
        "name": "fasterrcnn_train", "family": "two-stage detection training: torchvision's Faster R-CNN "
                                            "(MobileNetV3 FPN)",
        "script": f"{W}/w_fasterrcnn_train.py", "args": [], "capture_args": ["--steps", "30"],
        "step_range": "train_step", "kind": "training", "interleave": "all",
        "fixes": {
            "tf32": fix("tf32", None, "TF32 for float32 matmuls (the box head's GEMMs)"),
            "bf16": fix("bf16", False, "bf16 autocast over the forward and the losses"),
            "fewer_proposals": fix("fewer_proposals", True, "600 RPN proposals and 128 sampled per image "
                                                            "(2000 and 512 by default)"),
        },
        "expect": {
            "baseline": "8 images of 512 x 512: the backbone, FPN and RPN head's convolutions ~60-80 GFLOP "
                        "forward and backward (many small kernels, depthwise ones on NCHW), the box head's two "
                        "fully connected layers over 4,096 proposals ~330 GFLOP of float32 GEMMs (~6-8 ms on "
                        "CUDA cores), RoIAlign forward and backward ~1-2 ms; torchvision's per-image Python "
                        "(anchor matching, sampling with nonzero and randperm, box coding, NMS per level), "
                        "~20-40 ms of host time with reads back to the host. Expected 40-70 ms a step on an "
                        "H100, host-paced for most of it",
            "tf32": "unsure: the box head's GEMMs fall from ~7 ms to ~1.5, which shortens the step only where "
                    "the GPU sets its pace. Expected 1.0-1.15x",
            "bf16": "does not pay: autocast casts at every layer, the box coding and losses stay float32, and "
                    "the host's per-image work is unchanged. Expected 0.95-1.1x",
            "fewer_proposals": "pays: a quarter of the box head's rows and smaller NMS and sampling per image; the "
                               "backbone and the per-image Python stay. Expected 1.1-1.4x",
        },
    },
]
