"""The ten first-sight corpus programs of scripts/whatif/programs_firstsight_b.py on the CPU: each
program's own loop and one --interleave run, in-process (``main()`` under a patched
``sys.argv``), with stand-ins where a library is absent (torchvision, timm) or too slow on a CPU
(Inductor's compilation); and the registry checked against the programs' own fix lists."""
from __future__ import annotations

import importlib
import json
import re
import sys
import types
from pathlib import Path

import pytest

import shared

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "scripts" / "workloads"
sys.path.insert(0, str(WORKLOADS))
sys.path.insert(0, str(WORKLOADS.parent))
import whatif.programs_firstsight_b as registry  # noqa: E402


def test_registry_matches_the_programs():
    names = [p["name"] for p in registry.PROGRAMS]
    assert len(names) == 10 and len(set(names)) == 10
    for prog in registry.PROGRAMS:
        script = ROOT / prog["script"]
        known = shared.declared(script, "FIXES")
        assert set(prog["fixes"]) == set(known), prog["name"]
        for fix, entry in prog["fixes"].items():
            assert entry["args"] == ["--fix", fix] and entry["pays"] in (True, False, None), (prog["name"], fix)
            assert entry.get("compiles", False) == (fix in ("compile", "compile_graphs", "reduce_overhead")), fix
        want = prog["interleave"]
        assert want == "all" or set(want) <= set(known), prog["name"]
        assert set(prog["expect"]) == {"baseline", *prog["fixes"]}, prog["name"]
        assert prog["kind"] in ("training", "inference", "decode", "data")
        # the iteration's NVTX range is the one the program opens (_corpus.train_step's own, or a name of its own)
        text = script.read_text()
        assert f'"{prog["step_range"]}"' in text or (prog["step_range"] == "train_step" and "train_step(" in text), \
            prog["name"]
        # the capture's iteration count is within the corpus's 30-60
        assert 30 <= int(prog["capture_args"][prog["capture_args"].index("--steps") + 1]) <= 60


@pytest.fixture()
def corpus(monkeypatch):
    """The workloads' helpers importable, and torch on one thread: the CPU runs are many tiny
    kernels, which a second thread on a shared 2-core machine only slows down."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield importlib.import_module("_corpus")
    torch.set_num_threads(threads)


def _nms(boxes, scores, iou: float):
    """Greedy NMS in plain torch, as torchvision.ops.nms computes it."""
    import torch
    order, keep = scores.argsort(descending=True), []
    while order.numel():
        i, rest = order[0], order[1:]
        keep.append(i)
        a, b = boxes[i], boxes[rest]
        lt, rb = torch.maximum(a[:2], b[:, :2]), torch.minimum(a[2:], b[:, 2:])
        inter = (rb - lt).clamp(min=0).prod(1)
        area = lambda x: (x[..., 2] - x[..., 0]) * (x[..., 3] - x[..., 1])
        order = rest[inter / (area(a) + area(b) - inter) <= iou]
    return torch.stack(keep) if keep else torch.zeros(0, dtype=torch.long)


def _batched_nms(boxes, scores, idxs, iou: float):
    offsets = idxs.to(boxes) * (boxes.max() - boxes.min() + 1)
    return _nms(boxes + offsets[:, None], scores, iou)


@pytest.fixture()
def stand_ins(corpus, monkeypatch):
    """Stand-ins for what the CPU run cannot have or afford: torchvision (absent in CI: its NMS in
    plain torch, R3D-18 as a tiny 3-D conv net), timm (absent in CI: a tiny conv net) and
    torch.compile (Inductor takes minutes on this machine: the model is returned as it is)."""
    import torch
    nn = torch.nn

    def r3d_18(weights=None, num_classes: int = 400):
        return nn.Sequential(nn.Conv3d(3, 8, 3, padding=1), nn.BatchNorm3d(8), nn.ReLU(), nn.AdaptiveAvgPool3d(1),
                             nn.Flatten(), nn.Linear(8, num_classes))

    def create_model(name: str, pretrained: bool = False, num_classes: int = 1000, **_):
        assert not pretrained
        return nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.GELU(), nn.Conv2d(8, 8, 3, padding=1, groups=8),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LayerNorm(8), nn.Linear(8, num_classes))

    vision = types.SimpleNamespace(ops=types.SimpleNamespace(nms=_nms, batched_nms=_batched_nms),
                                   models=types.SimpleNamespace(video=types.SimpleNamespace(r3d_18=r3d_18)))
    monkeypatch.setitem(sys.modules, "torchvision", vision)
    monkeypatch.setitem(sys.modules, "timm", types.SimpleNamespace(create_model=create_model))
    monkeypatch.setattr(torch, "compile", lambda model, **_: model)
    return corpus


def _main(monkeypatch, capsys, script: str, argv: list[str]) -> str:
    """Run ``script``'s main() freshly imported (so that it binds this test's stand-ins) with
    ``argv``; return what it printed."""
    monkeypatch.delitem(sys.modules, script, raising=False)
    mod = importlib.import_module(script)
    monkeypatch.setattr(sys, "argv", ["prog", "--device", "cpu", "--small", *argv])
    mod.main()
    return capsys.readouterr().out


# script, the fix interleaved with the baseline, and one of its summary lines' numbers that the fix
# must leave as it is (None: the fix changes the numbers)
PROGRAMS = [
    ("w_detection_postproc_infer", "batched_nms", r"(\d+) detections in the last"),
    ("w_unet_diffusion_sample", "sdpa", r"mean ([-\d.]+)"),
    ("w_speech_conformer_train", "sorted_lengths", None),
    ("w_gnn_scatter_train", "csr_spmm", r"loss ([\d.]+ -> [\d.]+)"),
    ("w_video_r3d_train", "channels_last_3d", r"loss ([\d.]+)"),
    ("w_item_loss_small_train", "no_item", None),
    ("w_d2h_logits_numpy", "argmax_gpu", r"greedy match ([\d.]+)"),
    ("w_compiled_step_train", "fused_adamw", r"loss ([\d.]+)"),
    ("w_ema_timm_train", "foreach_ema", r"(loss [\d.]+, EMA distance [\d.e+-]+)"),
    ("w_contrastive_clip_train", "clamp_on_gpu", r"loss ([\d.]+)"),
]


@pytest.mark.parametrize("script,fix,same", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_program_loops_and_interleaves_on_the_cpu(stand_ins, monkeypatch, capsys, tmp_path, script, fix, same):
    base = _main(monkeypatch, capsys, script, ["--steps", "2"])
    assert f"{script}: 2 " in base and "fixes none" in base
    if same is not None:  # the same seed, the same data: the fix computes what the baseline does
        fixed = _main(monkeypatch, capsys, script, ["--steps", "2", "--fix", fix])
        assert f"fixes ['{fix}']" in fixed
        assert re.search(same, base).group(1) == re.search(same, fixed).group(1), (base, fixed)
    out = tmp_path / "ab.json"
    _main(monkeypatch, capsys, script, ["--interleave", str(out), "--variants", f"baseline,{fix}", "--rounds", "3"])
    got = json.loads(out.read_text())["variants"]
    assert list(got) == ["baseline", fix] and all(v["n_used"] == 2 for v in got.values())


def test_item_loss_program_reads_the_loss_every_step_or_every_fifty(stand_ins, monkeypatch, capsys):
    assert "120 losses logged" in _main(monkeypatch, capsys, "w_item_loss_small_train", ["--steps", "120"])
    assert "2 losses logged" in _main(monkeypatch, capsys, "w_item_loss_small_train",
                                      ["--steps", "120", "--fix", "no_item"])


def test_cuda_only_fixes_are_refused_on_the_cpu(stand_ins, monkeypatch, capsys):
    with pytest.raises(SystemExit):
        _main(monkeypatch, capsys, "w_unet_diffusion_sample", ["--fix", "graph"])
    assert "needs --device cuda" in capsys.readouterr().err
