"""`profkit classify` on a capture with trials (`profkit capture --try`): the measured gain beside
the model's price, the ranking by it, the trials no action shows, and the JSON fields. The trials
are written into a temporary copy of a committed trace (the committed one is never written)."""
from __future__ import annotations

import json
import lzma
import shutil
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from profkit.cli import main
from profkit.run.trials import summarize, trial_text
from profkit.show.render import run_lines

ROOT = Path(__file__).resolve().parents[1]
GPT2 = ROOT / "traces" / "corpus" / "gpt2_fp32_train.sqlite.xz"


def run(ms: float, seq: int) -> dict:
    """A run's periods: three warm-up ones (compiling, the allocator growing) three times as
    long, then nine around ``ms`` whose median is ``ms``."""
    ns = int(ms * 1e6)
    steady = [ns + d * ns // 200 for d in (-2, 1, 0, -1, 2, 0, 1, -1, 0)]
    return {"seq": seq, "iteration_ns": [3 * ns] * 3 + steady, "seconds": 4.2, "exit_code": 0}


# GPT-2 fp32 training as measured by the what-if corpus on an H200 (TF32 2.16-2.17x, bf16
# 2.44-2.53x, fused AdamW 1.02x): the runs of one session as `capture --try auto` makes them
TRIALS = {
    "format": "profkit-trials/1", "step_range": "train_step", "max_iterations": 16,
    "runs_per_trial": 2, "interrupted": False,
    "baseline": {"runs": [run(87.8, 0), run(88.4, 6), run(87.5, 11)]},
    "trials": [
        {"switch": "tf32", "applied": True, "error": None, "runs": [run(40.6, 1), run(40.2, 7)],
         "note": 'matmuls: torch.set_float32_matmul_precision("high")'},
        {"switch": "bf16", "applied": True, "error": None, "runs": [run(35.1, 2), run(35.6, 8)],
         "note": "autocast bf16 around module GPT2LMHeadModel (124.4M params)"},
        {"switch": "compile_graphs", "applied": True, "note": "", "runs": [],
         "error": "RuntimeError: Error: accessing tensor output of CUDAGraphs that has been "
                  "overwritten by a subsequent run."},
        {"switch": "compile", "applied": True, "error": None, "runs": [run(77.0, 4), run(76.1, 9)],
         "note": "torch.compile (default mode) of module GPT2LMHeadModel (124.4M params)"},
        {"switch": "fused_optim", "applied": True, "error": None, "runs": [run(86.0, 5), run(86.3, 10)],
         "note": "AdamW(fused=True) x1"},
        {"switch": "workers", "applied": False, "error": None, "runs": [run(87.9, 3)],
         "note": "no DataLoader"},
    ]}


@pytest.fixture(scope="module")
def with_trials(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trials") / "gpt2_fp32_train.sqlite"
    with lzma.open(GPT2) as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    con = sqlite3.connect(path)
    with con:
        con.execute("INSERT INTO PROFKIT_META (key, value) VALUES ('trials', ?)", (json.dumps(TRIALS),))
    con.close()
    return path


def classify(*args):
    return CliRunner().invoke(main, ["classify", *map(str, args)], catch_exceptions=False)


def test_summary_arithmetic():
    res = {t.switch: t for t in summarize(json.dumps(TRIALS))}
    tf32 = res["tf32"]
    # baselines 87.8, 88.4, 87.5 ms and the workers trial's run, which did not apply (the program
    # unchanged), 87.9 (median 87.85); trial runs 40.6 and 40.2 (median 40.4); each trial run
    # against the baseline run made nearest to it: seq 1 with 0, seq 7 with 6
    assert tf32.speedup == pytest.approx(87.85 / 40.4)
    assert (tf32.lo, tf32.hi) == pytest.approx((87.8 / 40.6, 88.4 / 40.2))
    assert tf32.iteration_ns == 40_400_000 and tf32.baseline_ns == 87_850_000
    assert tf32.warm_up_s == pytest.approx(3 * 2 * 0.0404)   # three periods at three times the step
    assert trial_text(tf32.as_dict()) == "2.17x (2 runs, 2.16-2.20x)"
    # a compile's first iterations, 40 s beyond the steady ones, are said apart from its gain
    assert trial_text({**tf32.as_dict(), "warm_up_s": 41.6}) == "2.17x (2 runs, 2.16-2.20x; 42 s of warm-up)"
    assert res["compile_graphs"].text().startswith("failed (RuntimeError: Error: accessing tensor")
    assert res["workers"].text() == "not applied (no DataLoader)" and not res["workers"].measured
    # seq 4 is nearest the workers trial's run (seq 3), seq 9 nearer 11 than 6
    assert (res["compile"].lo, res["compile"].hi) == pytest.approx((87.9 / 77.0, 87.5 / 76.1))
    assert res["compile"].lo < 87.85 / 76.55 < res["compile"].hi
    assert summarize(None) == [] and summarize("{") == [] and summarize('{"format": "other"}') == []


def test_classify_shows_the_trials_beside_the_model(with_trials):
    res = classify(with_trials, "--top", "1")
    assert res.exit_code == 0, res.stderr
    out = res.stdout.splitlines()
    start = next(i for i, ln in enumerate(out) if ln.startswith("actions"))
    end = next(i for i, ln in enumerate(out) if ln.startswith("together"))
    actions = " ".join(" ".join(out[start:end]).split())  # as one line, whatever the terminal's width
    assert actions.startswith(
        'actions 1. fp32 GEMMs on the CUDA cores: torch.set_float32_matmul_precision("high") (TF32) or '
        "run them in bf16 (autocast) [2.54x end to end; tried: 2.17x (2 runs, 2.16-2.20x); bf16 tried: 2.48x "
        "(2 runs, 2.48-2.50x); estimated: no "
        "replacement timed at capture; TF32 / fp32 peak = 7.4; step model: fp32 GEMMs 63.71 ms per iteration / 7.4: iteration 88.14 -> 34.70 ms "
        "without the profiler (mean over the window)] 2. torch.compile the model: Inductor fuses each "
        "run of small kernels between the GEMM/attention/convolution kernels into one (the GPU sets "
        "this step's pace) [1.13x end to end; tried: 1.15x (2 runs, 1.14-1.15x); step model:")
    # the trials no action shows: one line each (run_lines, before the terminal wraps them)
    run_ = json.loads(classify(with_trials, "--format", "json", "--top", "1").stdout)["run"]
    lines = run_lines(run_)
    tried = next(i for i, ln in enumerate(lines) if ln.startswith("tried"))
    expected = [
        "tried    bf16: 2.48x (2 runs, 2.48-2.50x); the model's price 2.26x (PK302)",
        "         compile_graphs: failed (RuntimeError: Error: accessing tensor output of CUDAGraphs "
        "that has been overwritten by a subsequent run.): reduce-overhead's CUDA graphs reuse their outputs' "
        "memory at the next call, and the program keeps outputs past it (gradients accumulated over "
        "micro-batches, results gathered across calls): clone what it keeps, or capture the step in a CUDA "
        "graph by hand (torch.cuda.graph); the model's price 1.13x (PK103)",
        "         fused_optim: 1.02x (2 runs, 1.01-1.03x); the model's price 1.02x (PK201)",
        "         workers: not applied (no DataLoader); not priced by the model"]
    assert lines[tried:tried + 5] == [*expected, lines[tried + 4]] and lines[tried + 4].startswith("rules")
    assert " ".join(" ".join(expected).split()) in " ".join(res.stdout.split())


def test_a_trial_against_the_calibration_run_alone_says_so():
    # the capture cut before the baseline runs that take turns with the trials
    t = {"switch": "bf16", "speedup": 0.53, "runs": 1, "lo": 0.53, "hi": 0.53, "applied": True,
         "error": None, "note": "", "warm_up_s": 0.0, "baseline_runs": 1}
    assert trial_text(t) == "0.53x (1 run; against a single run of the program unchanged)"
    assert trial_text({**t, "baseline_runs": 2}) == "0.53x (1 run)"


def test_classify_json_fields(with_trials):
    res = classify(with_trials, "--format", "json", "--top", "1")
    assert res.exit_code == 0, res.stderr
    run_ = json.loads(res.stdout)["run"]
    a1, a2, a3 = run_["actions"]
    assert a1["tried"] == {"switch": "tf32", "speedup": 2.175, "runs": 2, "lo": 2.163, "hi": 2.199,
                           "applied": True, "error": None, "warm_up_s": 0.2, "baseline_runs": 4,
                           "note": 'matmuls: torch.set_float32_matmul_precision("high")'}
    # compile: 87.85 / median(77.0, 76.1); its runs against baselines 3 and 11: 87.9 / 77.0, 87.5 / 76.1
    assert a2["code"] == "PK103" and a2["tried"] == {
        "switch": "compile", "speedup": 1.148, "runs": 2, "lo": 1.142, "hi": 1.15, "applied": True,
        "error": None, "warm_up_s": 0.5, "baseline_runs": 4,
        "note": "torch.compile (default mode) of module GPT2LMHeadModel (124.4M params)"}
    assert "tried" not in a3
    assert [(t["switch"], t["action"], t["code"], t["model"]) for t in run_["trials"]] == [
        ("tf32", 1, "PK302", 2.54), ("bf16", None, "PK302", 2.262), ("compile_graphs", None, "PK103", 1.129),
        ("compile", 2, "PK103", 1.129), ("fused_optim", None, "PK201", 1.022), ("workers", None, None, None)]
    # a trial that did not apply timed the program unchanged: no speedup
    assert run_["trials"][5]["speedup"] is None and run_["trials"][5]["runs"] == 1
    keys = {"switch", "speedup", "runs", "lo", "hi", "applied", "error", "note"}
    assert all(keys <= t.keys() for t in run_["trials"])
    cg = run_["trials"][2]
    assert (cg["speedup"], cg["runs"], cg["applied"]) == (None, 0, True) and cg["error"].startswith("RuntimeError")


def test_the_ranking_follows_a_measured_gain(with_trials, tmp_path):
    # compile measured far above its price: it goes first, its model price unchanged
    data = json.loads(json.dumps(TRIALS))
    data["trials"][3]["runs"] = [run(30.0, 4), run(30.5, 9)]
    path = tmp_path / "t.sqlite"
    shutil.copyfile(with_trials, path)
    con = sqlite3.connect(path)
    with con:
        con.execute("UPDATE PROFKIT_META SET value = ? WHERE key = 'trials'", (json.dumps(data),))
    con.close()
    run_ = json.loads(classify(path, "--format", "json", "--top", "1").stdout)["run"]
    assert [a["code"] for a in run_["actions"]] == ["PK103", "PK302", "PK301"]
    assert run_["actions"][0]["expected_end_to_end_speedup"] == 1.129
    assert run_["verdict"]["action"] == run_["actions"][0]["action"]


def test_a_trace_without_trials_is_as_before():
    res = classify(GPT2, "--format", "json", "--top", "1")
    run_ = json.loads(res.stdout)["run"]
    assert "trials" not in run_ and all("tried" not in a for a in run_["actions"])


# -- which trial tries which rule ----------------------------------------------------------------
def test_rules_name_their_trials_and_explain_them():
    from profkit.judge import rules
    from profkit.model import parse_trial
    for mod in rules.RULES:
        meta, text = mod.RULE, rules.explain(mod.RULE.code)
        has_section = any(ln == "Trial" for ln in text.splitlines())
        assert has_section == bool(meta.trials), meta.code
        for t in meta.trials:
            parse_trial(t.switch)                      # a trial the bootstrap can run
            assert f"--try {t.switch}" in " ".join(text.split()), (meta.code, t.switch)
            assert not t.evidence or f"``{t.evidence}``" in text, (meta.code, t.evidence)


def test_auto_trials_follow_the_rules_that_fired():
    import shared
    from profkit.judge.trials import auto_trials
    prof = shared.profile(GPT2)
    assert [(f.code, f.switch) for f in prof.findings() if f.switch] == [
        ("PK302", "tf32"), ("PK103", "compile"), ("PK402", "compile"), ("PK201", "fused_optim")]
    # one measurement speaks for one action: the compile trial for PK103's, the better priced
    from profkit.judge.trials import tried_of
    from profkit.run.trials import TrialResult
    t = TrialResult("compile", True, "", None, 1, 1.2, 1.2, 1.2, 1, 1, 0.0)
    assert list(tried_of(prof.findings(), [t])) == ["PK103"]
    # best price first: PK302's two, PK103's (its own first), PK201's; no convolutions here
    assert auto_trials(prof.findings(), prof, prof.run()) == ["tf32", "bf16", "compile", "compile_graphs", "fused_optim"]
    cnn = shared.profile(ROOT / "traces" / "real" / "loader_cnn.sqlite.xz")
    assert auto_trials(cnn.findings(), cnn, cnn.run()) == ["workers", "compile_graphs", "compile", "fused_optim", "cudnn_benchmark"]


# -- what the model learns from a trial ------------------------------------------------------------
def test_a_combination_is_repriced_with_the_measured_fix(with_trials):
    import profkit
    from profkit.judge.combine import scaled_edit
    prof = profkit.load(with_trials)
    run_ = prof.run_json()
    combo = run_["combinations"][0]
    # PK402's compile of the chains is PK103's fusion edit on fewer runs: it adds nothing to it
    assert combo["codes"] == ["PK302", "PK103"] and combo["expected_end_to_end_speedup"] == 3.829
    assert run_["combinations"][1]["codes"] == ["PK302", "PK103", "PK402"]
    assert run_["combinations"][1]["expected_end_to_end_speedup"] == 3.828
    wt = combo["with_trials"]
    # PK103's fusion edit gains less, not more, when pushed past the model's own change (1.13x
    # at 1, 1.09x at twice it): no scale of it reaches the measured 1.15x, and it stays unscaled
    assert sorted(wt["scaled"]) == ["PK302"]
    m302, a302 = wt["scaled"]["PK302"]
    assert m302 == 2.175 and 0 < a302 < 1          # measured below the price: less of the edit
    # the scaled edit, replayed alone, gives the measured gain
    model, host = prof.step_model(), prof.pricing_host
    f302 = next(f for f in prof.findings() if f.code == "PK302")
    base = model.simulate(host=host).mean_iteration_ns
    alone = base / model.simulate(scaled_edit(f302.edit, a302)(model.graph), host=host).mean_iteration_ns
    assert alone == pytest.approx(m302, rel=0.005)
    # scale 1 is the model's own edit, 0 the program unchanged
    full = base / model.simulate(scaled_edit(f302.edit, 1.0)(model.graph), host=host).mean_iteration_ns
    assert full == pytest.approx(f302.expected_end_to_end_speedup, rel=1e-6)
    assert base / model.simulate(scaled_edit(f302.edit, 0.0)(model.graph), host=host).mean_iteration_ns == 1.0
    # and the combination with it is less than the model's, more than the measured fix alone
    assert m302 < wt["expected_end_to_end_speedup"] < combo["expected_end_to_end_speedup"]
    lines = run_lines(run_)
    i = next(i for i, ln in enumerate(lines) if ln.startswith("together"))
    assert lines[i + 1] == (f"         with the trials: {wt['expected_end_to_end_speedup']:.2f}x (PK302's edit "
                            "scaled to its measured 2.17x)")


def test_an_action_whose_trial_never_ran_says_why():
    """item_loss_small_train was captured with --try-budget 60: the fused optimizer's trial never
    started. Its action says so, not "not applied" (the program was never run with it)."""
    res = classify(ROOT / "traces" / "corpus" / "item_loss_small_train.sqlite.xz", "--format", "json", "--top", "1")
    assert res.exit_code == 0, res.stderr
    fused = next(a for a in json.loads(res.stdout)["run"]["actions"] if a["code"] == "PK201")
    assert fused["tried"]["not_run"] == "the --try-budget of 60 s was spent before it"
    assert fused["tried"]["applied"] is False and fused["tried"]["speedup"] is None
    text = " ".join(classify(ROOT / "traces" / "corpus" / "item_loss_small_train.sqlite.xz", "--top", "1").stdout.split())
    assert "tried: not run (the --try-budget of 60 s was spent before it)" in text


def test_the_compile_trial_speaks_for_the_fusion_on_an_accumulating_step():
    """grad_accum_fp16_train (GPT-2 fp16, 8 micro-batches a step): reduce-overhead cannot run it,
    so PK103 offers graphs of the pieces between its syncs (1.11x); the default mode's compile,
    tried 1.81x, is PK402's fix (the chains fused), which it ranks first. Twice PK402's edit
    gains less than the trial: no trial-scaled combination is printed."""
    res = classify(ROOT / "traces" / "corpus" / "grad_accum_fp16_train.sqlite.xz", "--format", "json", "--top", "1")
    assert res.exit_code == 0, res.stderr
    run_ = json.loads(res.stdout)["run"]
    a1 = run_["actions"][0]
    assert a1["code"] == "PK402" and a1["tried"]["switch"] == "compile" and a1["tried"]["speedup"] == 1.814
    assert "PK103" not in [a["code"] for a in run_["actions"]]  # 1.11x, under the three shown
    pk103 = next(f for f in run_["findings"] if f["code"] == "PK103")
    assert "fusion alone: 1.75x" in pk103["action"] and "generate()" not in pk103["action"]
    assert all("with_trials" not in c for c in run_["combinations"])


VAE = ROOT / "traces" / "corpus" / "vae_distributions_train.sqlite.xz"


def test_the_checks_of_a_library_and_a_trial_of_another_fix():
    """vae_distributions_train (a VAE whose torch.distributions validate their arguments: 12
    syncs a step, host-bound; recaptured with two runs a trial): PK101 names the switch that turns
    the checks off (validate_args=False; measured 1.17x by hand). PK103's number is the graphs of
    the step's pieces by hand; its trial ran reduce-overhead on one of the program's two MLPs, and
    the trial's line gives the price of what it ran (the compiled pieces), not the number's.
    bf16 autocast reached both MLPs (the encoder alone had failed on the decoder's fp32 weights):
    0.81x tried, 0.84x priced."""
    res = classify(VAE, "--format", "json")
    assert res.exit_code == 0, res.stderr
    run_ = json.loads(res.stdout)["run"]
    a1 = run_["actions"][0]
    assert a1["code"] == "PK101" and a1["action"].startswith(
        "turn off torch.distributions' argument validation: pass validate_args=False (or call "
        "torch.distributions.Distribution.set_default_validate_args(False)) once the model is debugged: the "
        "per-step synchronisations in forward (12 per iteration) are its checks")
    trials = {t["switch"]: t for t in run_["trials"]}
    assert (trials["compile_graphs"]["code"], trials["compile_graphs"]["model"]) == ("PK103", 2.802)
    assert trials["compile_graphs"]["speedup"] == 0.772
    assert (trials["bf16"]["speedup"], trials["bf16"]["model"]) == (0.805, 0.841)
    assert trials["bf16"]["note"] == "autocast bf16 around module Sequential (1.9M params)"


def test_a_trial_that_left_part_of_the_program_out_ranks_nothing_below_its_price(tmp_path):
    """The same trace with its compile trials' record saying what a capture by this version
    says of the VAE (the decoder, called by the program too, left eager): the trials measured
    part of the fix, so PK103 ranks by its own number (graphs of the pieces by hand) and no
    combination is rescaled by them; the line says what was left out."""
    path = tmp_path / "vae.sqlite"
    with lzma.open(VAE) as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    con = sqlite3.connect(path)
    data = json.loads(con.execute("SELECT value FROM PROFKIT_META WHERE key = 'trials'").fetchone()[0])
    left = "the program's other module Sequential (1.9M params), not compiled"
    for t in data["trials"]:
        if t["switch"] in ("compile", "compile_graphs"):
            t["left_out"], t["note"] = left, f"{t['note']}; {left}"
    with con:
        con.execute("UPDATE PROFKIT_META SET value = ? WHERE key = 'trials'", (json.dumps(data),))
    con.close()
    run_ = json.loads(classify(path, "--format", "json").stdout)["run"]
    a1 = run_["actions"][0]
    assert a1["code"] == "PK103" and a1["tried"]["speedup"] == 0.772 and a1["tried"]["left_out"] == left
    assert a1["tried"]["model"] == 2.802 and a1["expected_end_to_end_speedup"] > 2.5
    scaled = [c["with_trials"]["scaled"] for c in run_["combinations"] if "with_trials" in c]
    assert all("PK103" not in s and "PK402" not in s for s in scaled)
    text = " ".join(classify(path).stdout.split())
    assert ("tried: torch.compile (mode reduce-overhead) of module Sequential (1.9M params); " + left
            + " 0.77x (2 runs, 0.76-0.85x; 6 s of warm-up), priced 2.80x;") in text


def test_an_interrupted_capture_is_said_to_be_one(tmp_path):
    # profkit capture records a profiled run stopped by Ctrl-C (or a time limit) in PROFKIT_META
    path = tmp_path / "cut.sqlite"
    with lzma.open(ROOT / "traces" / "corpus" / "kmeans_lloyd_loop.sqlite.xz") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    con = sqlite3.connect(path)
    with con:
        con.execute("UPDATE PROFKIT_META SET value = '1' WHERE key = 'interrupted'")
    con.close()
    res = classify(path, "--top", "1")
    assert res.exit_code == 0
    assert ("profkit: warning: this capture was interrupted before the script ended: the trace holds what "
            "ran until then") in res.stderr
    assert "interrupted" not in classify(ROOT / "traces" / "corpus" / "kmeans_lloyd_loop.sqlite.xz",
                                         "--top", "1").stderr


def test_a_gpu_paced_step_with_syncs_is_offered_the_fusion_and_a_measured_gain_is_an_action():
    # gp_cholesky_train (H100): GPU-paced, a status check per Cholesky (syncs: no whole-step
    # graph). PK103 offers torch.compile's fusion (1.23x) rather than "remove the syncs first";
    # its compile_graphs trial measured 1.17x, and the float64 action's own trial 1.02x ranks
    # it below
    run_ = json.loads(classify(ROOT / "traces" / "corpus" / "gp_cholesky_train.sqlite.xz",
                               "--format", "json", "--top", "1").stdout)["run"]
    top = run_["actions"][0]
    assert top["code"] == "PK103" and top["action"].startswith("torch.compile the model: Inductor fuses")
    assert top["expected_end_to_end_speedup"] == pytest.approx(1.23, abs=0.01)
    assert [v["switch"] for v in top["tried_variants"]] == ["compile_graphs"]
    assert run_["actions"][1]["code"] == "PK306" and run_["actions"][1]["tried"]["speedup"] == 1.017


def test_a_finding_priced_under_the_bar_is_an_action_where_its_trial_measured_a_gain():
    from profkit.judge.ranking import _measured_gain
    from profkit.run.trials import TrialResult
    def trial(speedup, lo, hi):
        return TrialResult("compile", True, "", None, 1, speedup, lo, hi, None, None, None)
    assert _measured_gain(trial(1.17, 1.17, 1.18), None)
    assert not _measured_gain(trial(1.01, 1.0, 1.02), None)
    # a run-by-run range reaching a loss is no gain to list; another fix's trial can be one
    assert not _measured_gain(trial(1.05, 0.97, 1.12), None)
    assert _measured_gain(None, [trial(1.3, 1.2, 1.4)])


def test_a_fix_the_program_failed_under_ranks_after_those_that_can_run():
    """fno_spectral_train (H100): PK103's torch.compile, priced 1.31x, failed in its trial
    (InductorError KeyError 'complex64'): it ranks after the fixes that can run, is said failed,
    and joins no combination; the fused optimizer first, saying how its complex parameters can
    take fused=True. A timeout says nothing of the fix: it is no failure."""
    from profkit.run.trials import TrialResult
    run_ = json.loads(classify(ROOT / "traces" / "corpus" / "fno_spectral_train.sqlite.xz",
                               "--format", "json").stdout)["run"]
    codes = [a["code"] for a in run_["actions"]]
    assert codes == ["PK201", "PK103", "PK401"], codes
    compile_ = run_["actions"][1]
    assert compile_["expected_end_to_end_speedup"] == pytest.approx(1.30, abs=0.01)
    assert compile_["tried"]["error"] == "InductorError: KeyError: 'complex64'"
    assert "torch.view_as_real" in run_["actions"][0]["action"]
    assert [c["codes"] for c in run_["combinations"]] == [["PK201", "PK401"]]

    def trial(error):
        return TrialResult("compile", True, "", error, 0, None, None, None, None, None, None)
    assert trial("InductorError: KeyError: 'complex64'").failed and trial("exit status 1: boom").failed
    assert not trial("timed out after 90 s (--try-timeout)").failed and not trial(None).failed
    assert not trial("too few iterations of `step` (2) for a steady time: ...").failed


def test_a_failure_a_small_edit_mends_is_said_with_the_edit_and_keeps_its_rank():
    """A failure of a kind that a small edit mends is said with the edit and is no failure of
    the fix. accum_resnet_train (H100): reduce-overhead failed on the gradients its
    micro-batches keep (its CUDA graph by hand measured 3.70x; PK103 offers that one)."""
    from profkit.run.trials import TrialResult
    run_ = json.loads(classify(ROOT / "traces" / "corpus" / "accum_resnet_train.sqlite.xz",
                               "--format", "json").stdout)["run"]
    assert run_["actions"][0]["code"] == "PK103"
    (graphs,) = [t for t in run_["trials"] if t["switch"] == "compile_graphs"]
    assert graphs["error"].startswith("RuntimeError: Error: accessing tensor output of CUDAGraphs")
    assert graphs["remedy"].startswith("reduce-overhead's CUDA graphs reuse their outputs' memory")
    t = TrialResult("bf16", True, "", "RuntimeError: expected scalar type BFloat16 but found Float",
                    0, None, None, None, None, None, None)
    assert not t.failed and "autocast" in t.remedy
    assert t.text().startswith("failed (RuntimeError: expected scalar type BFloat16 but found Float): the program")
