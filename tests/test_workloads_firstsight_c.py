"""The data-parallel first-sight programs of scripts/whatif/programs_firstsight_c.py on the CPU:
each launched as the harness launches it (torchrun, 2 ranks, gloo), every fix the CPU can run
interleaved with the baseline in one job; the registry checked against the programs' own fix
lists; and the paths that launch, capture and time programs of several ranks, and the one-GPU
paths that leave them out."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import shared

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "scripts" / "workloads"
sys.path.insert(0, str(ROOT / "scripts"))
from whatif import cli, per_rank, ranks, registry  # noqa: E402
import whatif.programs_firstsight_c as progs_c  # noqa: E402


def test_registry_matches_the_programs():
    from whatif.roles import FIX_RULES
    names = [p["name"] for p in progs_c.PROGRAMS]
    assert len(names) >= 2 and len(set(names)) == len(names)
    for prog in progs_c.PROGRAMS:
        script = ROOT / prog["script"]
        known = shared.declared(script, "FIXES")
        assert set(prog["fixes"]) == set(known), prog["name"]
        for fix, entry in prog["fixes"].items():
            assert entry["args"] == ["--fix", fix] and entry["pays"] in (True, False, None), (prog["name"], fix)
            assert (prog["name"], fix) in FIX_RULES
        assert prog["interleave"] == "all" and set(prog["expect"]) == {"baseline", *prog["fixes"]}
        assert prog["ranks"] == 2 and prog["launcher"] == "torchrun" and prog["first_sight"] and prog["family"]
        assert prog["kind"] == "training" and f'"{prog["step_range"]}"' in script.read_text() or \
            "train_step(" in script.read_text()
    # no_sync is priced by PK502, the rule written for it
    assert FIX_RULES[("ddp_accum_train", "no_sync")] == ("PK502", None)


def test_programs_of_several_ranks_go_through_their_launcher_and_stay_off_the_one_gpu_paths(capsys, tmp_path):
    prog = registry.select("ddp_accum_train")[0]
    assert registry.launch(prog, "py", ["--steps", "3"]) == [
        "py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", prog["script"], "--steps", "3"]
    assert registry.launch(prog, "py", ["nsys", "profile"], no_python=True)[-3:] == ["--no-python", "nsys", "profile"]
    one = registry.select("sync_loop")[0]
    assert registry.launch(one, "py", ["--x"]) == ["py", one["script"], "--x"]
    # list --capture (profkit capture, one process: corpus_capture.sh) leaves them out; --multirank lists them
    cli.main(["list", "--capture", "--fixed"])
    assert "ddp_" not in capsys.readouterr().out
    cli.main(["list", "--multirank"])
    rows = [ln.split("\t") for ln in capsys.readouterr().out.splitlines()]
    assert {r[0] for r in rows} == {p["name"] for p in progs_c.PROGRAMS} and all(r[1:3] == ["2", "torchrun"] for r in rows)
    # measure refuses them; interleave of all programs is a one-GPU run
    with pytest.raises(SystemExit, match="several ranks"):
        cli.main(["measure", str(tmp_path / "m"), "--programs", "ddp_accum_train"])
    # the rank substitution of per-rank output names
    assert per_rank.command(["-o", "out/rank{RANK}", "x"], "1") == ["-o", "out/rank1", "x"]


def test_capture_ranks_dry_run_prints_each_ranks_commands(capsys, tmp_path):
    cli.main(["capture-ranks", str(tmp_path), "--dry-run", "--python", "py"])
    out = capsys.readouterr().out
    for prog in progs_c.PROGRAMS:
        assert f"# {prog['name']} (2 ranks)" in out
        assert f"rank{{RANK}}" in out and f"{prog['name']}/rank1.sqlite" in out
    cmds = ranks.commands(progs_c.PROGRAMS[0], tmp_path, "py")
    # calibration: the bootstrap's timings per rank; the profile: one nsys per rank with profkit capture's flags
    assert cmds["calibrate"][:7] == ["py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                                     "--no-python"]
    assert "--calibrate" in cmds["calibrate"] and "--cuda-graph-trace=node" in cmds["profile"]
    assert len(cmds["export"]) == 2
    with pytest.raises(SystemExit, match="one GPU"):
        cli.main(["capture-ranks", str(tmp_path), "--programs", "sync_loop", "--dry-run"])


@pytest.fixture()
def gloo():
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available")
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


@pytest.mark.long
@pytest.mark.parametrize("name", [p["name"] for p in progs_c.PROGRAMS])
def test_every_fix_the_cpu_runs_interleaves_with_the_baseline_on_two_ranks(gloo, tmp_path, name):
    prog = registry.select(name)[0]
    cuda_only = shared.declared(ROOT / prog["script"], "CUDA_ONLY")
    variants = ["baseline", *[f for f in prog["fixes"] if f not in cuda_only]]
    out = tmp_path / "timed.json"
    cmd = registry.launch(prog, sys.executable, ["--small", "--device", "cpu", "--interleave", str(out),
                                                 "--variants", ",".join(variants), "--rounds", "3"])
    r = subprocess.run(cmd, cwd=ROOT, env=gloo, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    timed = json.loads(out.read_text())["variants"]  # written by rank 0 alone
    assert list(timed) == variants and all(v["median_ns"] > 0 and v["n_used"] == 2 for v in timed.values())
    assert "interleaved no_sync" in r.stdout or name != "ddp_accum_train"


def test_the_accumulation_loop_ends_with_the_same_weights_on_every_rank(gloo):
    prog = registry.select("ddp_accum_train")[0]
    cmd = registry.launch(prog, sys.executable, ["--small", "--device", "cpu", "--steps", "3", "--fix", "no_sync"])
    r = subprocess.run(cmd, cwd=ROOT, env=gloo, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "world 2, 3 steps, fixes ['no_sync']" in r.stdout and "weights identical across ranks: True" in r.stdout


def test_cuda_only_fixes_are_refused_on_the_cpu(monkeypatch, capsys):
    pytest.importorskip("torch")
    sys.path.insert(0, str(WORKLOADS))
    import w_ddp_accum_train as w
    monkeypatch.setattr(sys, "argv", ["w_ddp_accum_train.py", "--device", "cpu", "--fix", "bf16_compress"])
    with pytest.raises(SystemExit):
        w.main()
    assert "needs --device cuda" in capsys.readouterr().err
