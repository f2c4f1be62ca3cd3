"""The what-if harness's interleaved timing: variants side by side in one process, blocks that take
turns, each fix's gain paired round by round, and the page reading those folders first."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from whatif import cli, merge, registry, store  # noqa: E402  (scripts/whatif/: scripts/whatif_accuracy.py's harness)


def test_paired_gain_divides_out_a_drift_that_the_ratio_of_medians_keeps():
    # The CPU runs 2x slower in rounds 3-6 for both variants; the fix is 1.25x in every round.
    slow = [1, 1, 1, 2, 2, 2, 2, 1, 1]
    base = [10.0 * s for s in slow]
    fix = [8.0 * s for s in slow]
    fix[4:7] = [16.0, 16.0, 16.0]
    assert merge.paired_gain(base, fix) == pytest.approx(1.25)
    # ...and leaves the first (warm-up) round out
    assert merge.paired_gain([100.0, 10, 10, 10], [1.0, 10, 10, 10]) == pytest.approx(1.0)
    # the ratio of the medians of blocks that drift apart does not: 4 slow rounds of the
    # baseline against 2 of the fix
    drift_base = [10, 10, 20, 20, 20, 20, 10]
    drift_fix = [8, 8, 8, 16, 16, 8, 8]
    assert sorted(drift_base[1:])[3] / sorted(drift_fix[1:])[3] != pytest.approx(1.25)


def _measured(runs: dict) -> dict:
    return {"runs": runs}


def test_interleaved_folders_alone_give_the_gain_where_a_pair_has_them():
    runs = {"p": {
        "baseline": {"a_r1": {"median_ns": 10.0}, "a_r2": {"median_ns": 12.0}, "ab-b_r1": {"median_ns": 10.0}},
        "fix": {"a_r1": {"median_ns": 5.0}, "a_r2": {"median_ns": 12.0}, "ab-b_r1": {"median_ns": 9.0, "gain": 1.2}},
    }}
    both = store.measured_speedups(_measured(runs))
    assert both[("p", "fix")] == (1.2, 1, [1.2])  # the paired gain, not 10 / 9
    apart = store.measured_speedups(_measured(runs), interleaved=False)
    assert apart[("p", "fix")][0] == pytest.approx(1.5) and apart[("p", "fix")][1] == 2
    assert store.timed_baseline(_measured(runs), "p", "fix") == 10.0
    assert store.timed_baseline(_measured(runs), "p", "fix", interleaved=False) == 11.0
    # a fix timed only interleaved has no separate-run gain (not one made of other runs' medians)
    runs["p"]["only_ab"] = {"ab-b_r1": {"median_ns": 5.0, "gain": 2.0}}
    assert ("p", "only_ab") not in store.measured_speedups(_measured(runs), interleaved=False)
    assert store.measured_speedups(_measured(runs))[("p", "only_ab")][0] == 2.0


def test_an_interleaved_folder_slowed_by_the_collector_gives_way_to_separate_runs():
    # tabular_mlp_train's baseline beside its fixes: 41.0 ms an iteration, 19.3 ms of it in the
    # garbage collector walking every variant's objects; 16.4 ms alone in its own process
    runs = {"p": {
        "baseline": {"s_r1": {"median_ns": 16.4}, "ab-b_r1": {"median_ns": 41.0, "gc_ns": 19.3}},
        "fix": {"s_r1": {"median_ns": 2.6}, "ab-b_r1": {"median_ns": 4.5, "gain": 9.1}},
    }}
    got = store.measured_speedups(_measured(runs))[("p", "fix")]
    assert got[0] == pytest.approx(16.4 / 2.6) and got[1] == 1
    assert store.timed_baseline(_measured(runs), "p", "fix") == 16.4
    # a collector under a quarter of the iteration keeps the interleaved folder; so does a pair
    # with no separate run (nothing better to read)
    runs["p"]["baseline"]["ab-b_r1"]["gc_ns"] = 9.0
    assert store.measured_speedups(_measured(runs))[("p", "fix")] == (9.1, 1, [9.1])
    runs["p"]["baseline"]["ab-b_r1"]["gc_ns"] = 19.3
    runs["p"]["only_ab"] = {"ab-b_r1": {"median_ns": 5.0, "gain": 2.0}}
    assert store.measured_speedups(_measured(runs))[("p", "only_ab")][0] == 2.0


def _committed_data(tmp_path: Path, monkeypatch) -> Path:
    """An empty committed-data file (and raw-block folder) in tmp_path in place of the real ones."""
    data = tmp_path / "measured_h200.json.xz"
    store.write_data(data, {"how": "x.", "runs": {}})
    monkeypatch.setattr(store, "MEASURED", data)
    monkeypatch.setattr(store, "INTERLEAVED", tmp_path / "raw.json.xz")
    monkeypatch.setattr(store, "ROOT", tmp_path)
    return data


def test_merge_names_interleaved_folders_and_pairs_each_fixs_blocks(tmp_path, monkeypatch):
    out = tmp_path / "i"
    (out / "calib").mkdir(parents=True)
    blocks = {"rounds": 4, "variants": {
        "baseline": {"block_iterations": 10, "block_ns": [99, 10, 20, 10], "median_ns": 10, "n_used": 3,
                     "issue_ns": [9, 4, 6, 4], "issue_median_ns": 4},
        "tf32": {"block_iterations": 10, "block_ns": [1, 5, 10, 5], "median_ns": 5, "n_used": 3}}}
    (out / "calib" / "prog__interleaved__1.json").write_text(json.dumps(blocks))
    measured = {"interleaved": True, "programs": {"prog": {"variants": {
        "baseline": {"reps": [1], "median_ns": [10], "n_used": [30]},
        "tf32": {"reps": [1], "median_ns": [5], "n_used": [30]}}}}}
    (out / "measured.json").write_text(json.dumps(measured))
    data = _committed_data(tmp_path, monkeypatch)
    cli.main(["merge", str(out / "measured.json"), "--folder", "9"])
    got = store.read_data(data)["runs"]["prog"]
    # the host's issue time comes along where the process timed it (older blocks have none)
    assert got["baseline"] == {"ab-9_r1": {"iterations": 30, "median_ns": 10, "issue_ns": 4}}
    assert got["tf32"]["ab-9_r1"] == {"iterations": 30, "median_ns": 5, "gain": 2.0}
    assert store.interleaved_blocks() == {"ab-9_r1__prog": blocks}
    # the raw blocks are needed: without them merge says so in one line
    (out / "calib" / "prog__interleaved__1.json").unlink()
    store.write_data(data, {"how": "x.", "runs": {}})
    with pytest.raises(SystemExit, match="needs its calib/ folder"):
        cli.main(["merge", str(out / "measured.json"), "--folder", "10"])


def test_interleave_refuses_programs_whose_script_cannot(tmp_path):
    # (empty_cache in the loop releases every variant's cached blocks: it needs a process of its own)
    with pytest.raises(SystemExit, match="cannot interleave"):
        cli.main(["interleave", str(tmp_path / "out"), "--programs", "gpt2_empty_cache"])
    assert not (tmp_path / "out").exists()
    names = {p["name"] for p in registry.PROGRAMS if p.get("interleave")}
    assert {"resnet50_b4_infer", "sync_loop", "t5_finetune", "numpy_aug_train"} <= names
    for p in registry.PROGRAMS:  # a listed fix must be one of the program's
        if isinstance(p.get("interleave"), list):
            assert set(p["interleave"]) <= set(p["fixes"]), p["name"]
    # DataLoader workers prefetch in the background, so they are never interleaved
    aug = next(p for p in registry.PROGRAMS if p["name"] == "numpy_aug_train")
    assert "workers" not in aug["interleave"]


# --- the workloads' side: scripts/workloads/_corpus.py --------------------------------------------

@pytest.fixture()
def corpus():
    pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "scripts" / "workloads"))
    import _corpus
    return _corpus


def test_interleave_times_variants_in_turns_and_writes_their_blocks(corpus, tmp_path):
    import torch
    calls: list[str] = []

    def step(name: str, s: float):
        def run() -> None:
            calls.append(name)
            time.sleep(s)
        return run

    path = tmp_path / "ab.json"
    out = corpus.interleave({"baseline": step("baseline", 0.002), "tf32": step("tf32", 0.001)},
                            {"baseline": set(), "tf32": {"tf32"}}, str(path), torch.device("cpu"),
                            rounds=3, warm=1, block_s=0.02)
    assert json.loads(path.read_text()) == out
    v = out["variants"]
    assert v["baseline"]["n_used"] == 2 and len(v["baseline"]["block_ns"]) == 3
    assert v["baseline"]["block_iterations"] == 10  # 0.02 s of 2 ms steps
    assert 1.3 < v["baseline"]["median_ns"] / v["tf32"]["median_ns"] < 4  # sleeps overshoot on a loaded machine
    # the order reverses each round: A B, B A, A B (after each variant's warm-up and sizing run),
    # each round followed by the issue timing of each variant in the round's order (one untimed
    # iteration, two timed)
    timed, nt = calls[2 * (1 + 3):], v["tf32"]["block_iterations"]
    r = 10 + nt + 6
    assert len(timed) == 3 * r
    assert timed[10 + nt:r] == ["baseline"] * 3 + ["tf32"] * 3
    assert [timed[0], timed[10], timed[r], timed[r + nt], timed[r + nt + 10], timed[r + nt + 13], timed[2 * r]] == \
        ["baseline", "tf32", "tf32", "baseline", "tf32", "baseline", "baseline"]
    # the host's issue time of one iteration: the step's own sleep, the blocks' pace aside
    assert len(v["baseline"]["issue_ns"]) == 3
    assert 1.5e6 < v["baseline"]["issue_median_ns"] < 20e6 and v["tf32"]["issue_median_ns"] < v["baseline"]["issue_median_ns"]
    assert torch.get_float32_matmul_precision() == "highest"  # tf32 left off afterwards
    # what the collector took per iteration beside each block (nothing here: the steps sleep), and
    # the objects the process held
    assert v["baseline"]["gc_median_ns"] >= 0 and out["live_objects"] > 1000
    import gc
    assert not any(getattr(cb, "__self__", None).__class__.__name__ == "GcClock" for cb in gc.callbacks)


def test_the_collectors_time_is_counted_beside_each_block(corpus):
    """A step that makes cyclic garbage gets the collector's passes counted against it."""
    import gc
    clock = corpus.GcClock()
    try:
        before = clock.ns
        for _ in range(3):
            a = []
            a.append(a)
            gc.collect()
        assert clock.ns > before
    finally:
        clock.stop()
    assert clock._on not in gc.callbacks


def test_a_variant_that_fails_leaves_the_others_timed(corpus, tmp_path):
    """torch.compile fails at a variant's first call where it cannot handle the program's shapes
    (an InductorError): that variant is written under `failed` with its error on one line, the
    others are timed; built or warmed up, a failing baseline still ends the run."""
    import torch
    calls: list[str] = []

    def step(name: str, fail_at: int = 0):
        def run() -> None:
            calls.append(name)
            if fail_at and calls.count(name) >= fail_at:
                raise RuntimeError(f"{name} cannot split\nsecond line")
        return run

    out = corpus.interleave({"baseline": step("baseline"), "compile": step("compile", fail_at=2),
                             "bf16": step("bf16")}, {"baseline": set(), "compile": set(), "bf16": set()},
                            str(tmp_path / "ab.json"), torch.device("cpu"), rounds=3, warm=2, block_s=0.001,
                            failed={"graph": "ValueError: no static shapes"})
    assert set(out["variants"]) == {"baseline", "bf16"}
    assert out["failed"] == {"compile": "RuntimeError: compile cannot split",
                             "graph": "ValueError: no static shapes"}
    assert calls.count("compile") == 2 and json.loads((tmp_path / "ab.json").read_text()) == out
    with pytest.raises(RuntimeError, match="baseline cannot split"):
        corpus.interleave({"baseline": step("baseline", fail_at=1)}, {"baseline": set()}, None,
                          torch.device("cpu"), rounds=3, warm=2)

    def build(args, fixes, dev):
        if "compile" in fixes:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return lambda: len(fixes)

    ns = argparse.Namespace(interleave=str(tmp_path / "run.json"), variants="baseline,compile,a", device="cpu",
                            variant_fixes={"baseline": set(), "compile": {"compile"}, "a": {"a"}}, rounds=3,
                            steps=4, small=True)
    assert corpus.run(build, ns, set(), torch.device("cpu")) is None
    got = json.loads((tmp_path / "run.json").read_text())
    assert set(got["variants"]) == {"baseline", "a"} and got["failed"] == {"compile": "OutOfMemoryError: CUDA out of memory"}


def test_variants_are_checked_as_fixes_are(corpus):
    ap = argparse.ArgumentParser()
    ns = argparse.Namespace(interleave="x.json", variants="baseline,tf32+cuda_graph", device="cpu", rounds=15)
    with pytest.raises(SystemExit):
        corpus.check_interleave(ap, ns, set(), ("tf32", "cuda_graph"), cuda_only=("cuda_graph",))
    ns = argparse.Namespace(interleave="x.json", variants="baseline", device="cuda", rounds=15)
    with pytest.raises(SystemExit):
        corpus.check_interleave(ap, ns, set(), ("tf32",))
    ns = argparse.Namespace(interleave="x.json", variants="baseline,tf32", device="cuda", rounds=15)
    with pytest.raises(SystemExit):  # --fix and --interleave together
        corpus.check_interleave(ap, ns, {"tf32"}, ("tf32",))
    ns = argparse.Namespace(interleave="x.json", variants="baseline,a,b", device="cuda", rounds=15)
    with pytest.raises(SystemExit):  # alternatives joined
        corpus.check_interleave(ap, argparse.Namespace(interleave="x.json", variants="baseline,a+b",
                                                       device="cuda", rounds=15),
                                set(), ("a", "b"), alternatives=({"a", "b"},))
    corpus.check_interleave(ap, ns, set(), ("a", "b"), alternatives=({"a", "b"},))
    assert ns.variant_fixes == {"baseline": set(), "a": {"a"}, "b": {"b"}}


def test_run_loops_or_interleaves_and_names_what_cannot_share_a_process(corpus, tmp_path):
    import torch

    def build(args, fixes, dev):
        return lambda: len(fixes)

    base = dict(device="cpu", rounds=3, steps=4)
    got = corpus.run(build, argparse.Namespace(interleave=None, **base), {"a"}, torch.device("cpu"))
    assert got is not None and got[1] == [1, 1, 1, 1]
    ns = argparse.Namespace(interleave=str(tmp_path / "ab.json"), variants="baseline,a",
                            variant_fixes={"baseline": set(), "a": {"a"}}, **base)
    with pytest.raises(SystemExit, match="a prefetches in the background: time it in runs of its own"):
        corpus.run(build, ns, set(), torch.device("cpu"), not_interleaved={"a": "prefetches in the background"})
    assert not (tmp_path / "ab.json").exists()
    ns.not_interleaved = None
    assert corpus.run(build, ns, set(), torch.device("cpu")) is None
    assert set(json.loads((tmp_path / "ab.json").read_text())["variants"]) == {"baseline", "a"}


@pytest.fixture()
def tiny_torchvision(corpus, monkeypatch):
    """A stand-in ``torchvision`` whose classifiers are one small conv net, so that the torchvision
    workloads' loops and --interleave run on the CPU where torchvision is not installed."""
    import types

    import torch

    def classifier(num_classes: int = 1000, **_):
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                   torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                   torch.nn.Linear(8, num_classes))
    models = types.SimpleNamespace(**{a: classifier for a in (
        "resnet18", "resnet50", "efficientnet_b0", "mobilenet_v3_large", "convnext_tiny", "regnet_y_800mf")})
    monkeypatch.setitem(sys.modules, "torchvision", types.SimpleNamespace(models=models))
    return corpus


@pytest.mark.parametrize("script,extra,variants", [
    ("w_resnet50_fp32_infer", ["--arch", "efficientnet_b0"], "baseline,channels_last,bf16_channels_last,tf32"),
    ("w_resnet18_pageable", [], "baseline,channels_last_bf16"),
    ("w_resnet50_train", [], "baseline,fused_sgd"),
    ("w_numpy_aug_train", [], "baseline,gpu_aug"),
])
def test_torchvision_workloads_loop_and_interleave_on_the_cpu(tiny_torchvision, monkeypatch, tmp_path, capsys,
                                                              script, extra, variants):
    import importlib
    mod = importlib.import_module(script)
    base = ["prog", "--device", "cpu", "--small", *extra]
    monkeypatch.setattr(sys, "argv", [*base, "--steps", "3"])
    mod.main()
    assert "3 " in capsys.readouterr().out
    out = tmp_path / "ab.json"
    monkeypatch.setattr(sys, "argv", [*base, "--interleave", str(out), "--variants", variants, "--rounds", "3"])
    mod.main()
    got = json.loads(out.read_text())["variants"]
    assert list(got) == variants.split(",") and all(v["n_used"] == 2 for v in got.values())
    # each variant's output size, so that a fix timed doing less work shows (inference: the
    # logits of the batch; a training step returns its loss or nothing)
    assert all(v["output_size"] is None or v["output_size"] >= 1 for v in got.values())


def test_freeze_compile_fix_runs_through_dynamo(tiny_torchvision, monkeypatch, capsys):
    # PK403's fix on the stand-in classifier (Inductor's freezing itself is a GPU run's)
    import importlib

    import shared
    import torch
    monkeypatch.setattr(torch._inductor.config, "freezing", False)   # the fix sets it; put back after
    shared.compile_through_dynamo(torch, importlib.import_module("w_resnet50_fp32_infer"), "w_resnet50_fp32_infer",
                                  monkeypatch, capsys, fix="freeze_compile", more=("--arch", "mobilenet_v3_large"))
    assert torch._inductor.config.freezing is True


def test_output_size_counts_the_values_returned(corpus):
    import torch
    output_size = corpus.output_size
    dets = [[[0.0] * 6] * 3, [], [[1.0] * 6]]          # per image: 3, 0 and 1 detections
    assert output_size(dets) == 24
    assert output_size((torch.zeros(2, 5), {"loss": 1.5, "ids": [1, 2]})) == 13
    assert output_size(None) is None and output_size([None, torch.ones(3)]) == 3


def test_interleave_harness_end_to_end_with_a_stand_in_program(tmp_path, monkeypatch, capsys):
    # A program that writes what _corpus.interleave writes, so that the harness's bookkeeping
    # (one process a rep, its blocks into measured.json, a failure recorded, merge) runs here.
    script = tmp_path / "fake.py"
    script.write_text(
        "import json, sys\n"
        "a = sys.argv\n"
        "out, names = a[a.index('--interleave') + 1], a[a.index('--variants') + 1].split(',')\n"
        "if '--fail' in a: sys.exit(3)\n"
        "blocks = {'baseline': [9, 10, 12, 10], 'fix': [9, 5, 6, 5]}\n"
        "broke = {n: 'InductorError: CantSplit' for n in names if n not in blocks}\n"
        "json.dump({'variants': {n: {'block_iterations': 10, 'block_ns': blocks[n],\n"
        "          'median_ns': sorted(blocks[n][1:])[1], 'n_used': 3} for n in names if n in blocks},\n"
        "           **({'failed': broke} if broke else {})}, open(out, 'w'))\n")
    progs = [{"name": "fake", "script": str(script), "args": [], "step_range": "s", "kind": "inference",
              "interleave": "all", "fixes": {"fix": {"args": ["--fix", "fix"], "pays": True},
                                             "compile": {"args": ["--fix", "compile"], "pays": True}}},
             {"name": "broken", "script": str(script), "args": ["--fail"], "step_range": "s",
              "kind": "inference", "interleave": ["fix"], "fixes": {"fix": {"args": [], "pays": True}}}]
    monkeypatch.setattr(registry, "PROGRAMS", progs)
    out = tmp_path / "i"
    cli.main(["interleave", str(out), "--programs", "fake,broken", "--reps", "2", "--rounds", "4"])
    m = json.loads((out / "measured.json").read_text())
    fake = m["programs"]["fake"]["variants"]
    assert m["interleaved"] and fake["baseline"]["reps"] == [1, 2] and fake["fix"]["median_ns"] == [5, 5]
    assert m["runs"][0]["programs"] == ["fake", "broken"]  # the call recorded, as measure records its own
    assert fake["fix"]["n_used"] == [30, 30]
    # a fix that failed inside the process: its failure recorded, the others timed
    assert fake["compile"]["reps"] == [] and \
        [f["reason"] for f in fake["compile"]["failures"]] == ["InductorError: CantSplit"] * 2
    broken = m["programs"]["broken"]["variants"]["fix"]
    assert broken["reps"] == [] and [f["reason"] for f in broken["failures"]] == ["exit status 3"] * 2
    assert "fake rep 1" in capsys.readouterr().out
    # a second call resumes: nothing measured is run again
    cli.main(["interleave", str(out), "--programs", "fake", "--reps", "2"])
    assert json.loads((out / "measured.json").read_text())["programs"]["fake"]["variants"]["fix"]["reps"] == [1, 2]
    data = _committed_data(tmp_path, monkeypatch)
    cli.main(["merge", str(out / "measured.json"), "--folder", "7"])
    runs = store.read_data(data)["runs"]
    assert runs["fake"]["fix"]["ab-7_r2"]["gain"] == 2.0  # median of 10/5, 12/6, 10/5
    assert "broken" not in runs
