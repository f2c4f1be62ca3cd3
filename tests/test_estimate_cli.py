"""`profkit estimate`: the four decision calculations, exact output, and one-line errors on bad numbers."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from profkit.cli import main


def run(*args: str):
    return CliRunner().invoke(main, ["estimate", *args], catch_exceptions=False)


def test_fusion_exact():
    res = run("fusion", "--kernel-us", "40", "40", "40", "--launch-us", "5", "--fused-us", "70")
    assert res.exit_code == 0, res.output
    assert res.stdout == (
        "unfused: 3 kernels, 120 us + 3 x 5 us launch = 135 us\n"
        "fused:   1 kernel, 70 us + 1 x 5 us launch = 75 us\n"
        "fusion ceiling: 135/75 = 1.80x\n"
        "(an upper bound: it holds only if the fused kernel really runs in 70 us; measure it)\n")


def test_fusion_accepts_comma_separated_kernels():
    a = run("fusion", "--kernel-us", "40,40,40", "--launch-us", "5", "--fused-us", "70")
    b = run("fusion", "--launch-us", "5", "--fused-us", "70", "--kernel-us", "40", "40", "40")
    assert a.exit_code == b.exit_code == 0
    assert a.stdout == b.stdout and "135/75 = 1.80x" in a.stdout


def test_programs_exact():
    res = run("programs", "-n", "1000000", "--block", "1024")
    assert res.exit_code == 0
    assert res.stdout == ("programs: ceil(1000000 / 1024) = 977\n"
                          "last program: 576 of 1024 lanes live, 448 masked\n")


def test_amdahl_exact():
    res = run("amdahl", "--share", "0.25", "--speedup", "4")
    assert res.exit_code == 0
    assert res.stdout == ("end to end: 1 / ((1 - 0.25) + 0.25 / 4) = 1.23x\n"
                          "limit with the op made infinitely fast: 1.33x\n")


def test_amdahl_whole_run():
    res = run("amdahl", "--share", "1", "--speedup", "2")
    assert res.exit_code == 0
    assert res.stdout.endswith("= 2.00x\nlimit with the op made infinitely fast: unbounded\n")


def test_autotune_worth_it_exact():
    res = run("autotune", "--configs", "12", "--runs", "20", "--ms", "0.2", "--saved-us", "5",
              "--calls", "1000000")
    assert res.exit_code == 0
    assert res.stdout == ("tuning: 12 configs x 20 runs x 0.2 ms = 48 ms\n"
                          "saved: 5 us x 1000000 calls = 5 s\n"
                          "break-even: 9600 calls\n"
                          "worth it: 48 ms of tuning saves 5 s\n")


def test_autotune_not_worth_it_exact():
    res = run("autotune", "--configs", "12", "--runs", "20", "--ms", "0.2", "--saved-us", "5",
              "--calls", "100")
    assert res.exit_code == 0
    assert res.stdout == ("tuning: 12 configs x 20 runs x 0.2 ms = 48 ms\n"
                          "saved: 5 us x 100 calls = 500 us\n"
                          "break-even: 9600 calls\n"
                          "not worth it: 48 ms of tuning saves only 500 us\n")


def test_same_functions_as_the_advisor(monkeypatch):
    """The CLI calls profkit.judge.estimate's functions (the ones the advisor uses), not copies."""
    from profkit.judge import estimate as est
    calls = []
    real = est.amdahl
    monkeypatch.setattr(est, "amdahl", lambda p, s: calls.append((p, s)) or real(p, s))
    assert run("amdahl", "--share", "0.5", "--speedup", "2").exit_code == 0
    assert (0.5, 2.0) in calls


@pytest.mark.parametrize("sub", ["fusion", "programs", "amdahl", "autotune"])
def test_each_subcommand_has_help(sub):
    res = run(sub, "--help")
    assert res.exit_code == 0
    assert f"estimate {sub} [OPTIONS]" in res.stdout and "--help" in res.stdout


def test_group_help_lists_subcommands():
    res = run("--help")
    assert res.exit_code == 0
    for sub in ("fusion", "programs", "amdahl", "autotune"):
        assert sub in res.stdout


@pytest.mark.parametrize("args, message", [
    (["amdahl", "--share", "1.5", "--speedup", "4"], "share p must be within 0..1, not 1.5"),
    (["amdahl", "--share", "-0.1", "--speedup", "4"], "share p must be within 0..1"),
    (["amdahl", "--share", "0.25", "--speedup", "0"], "speedup s must be positive"),
    (["amdahl", "--share", "0.25", "--speedup", "-2"], "speedup s must be positive"),
    (["amdahl", "--share", "abc", "--speedup", "4"], "--share: 'abc' is not a number"),
    (["amdahl", "--share", "nan", "--speedup", "4"], "--share: 'nan' is not a finite number"),
    (["fusion", "--kernel-us", "40", "-5", "--launch-us", "5", "--fused-us", "70"],
     "--kernel-us: kernel times must be positive, not -5"),
    (["fusion", "--kernel-us", "40", "0", "--launch-us", "5", "--fused-us", "70"],
     "kernel times must be positive, not 0"),
    (["fusion", "--kernel-us", "40", "--launch-us", "-5", "--fused-us", "70"], "launch >= 0"),
    (["fusion", "--kernel-us", "40", "--launch-us", "5", "--fused-us", "0"], "a positive fused time"),
    (["fusion", "--kernel-us", "40", "x", "--launch-us", "5", "--fused-us", "70"], "--kernel-us: 'x' is not a number"),
    (["fusion", "--kernel-us", "40", "--bogus", "--launch-us", "5", "--fused-us", "70"], "no such option: --bogus"),
    (["programs", "-n", "0", "--block", "1024"], "n and block must be positive"),
    (["programs", "-n", "1000", "--block", "-4"], "n and block must be positive"),
    (["programs", "-n", "1.5", "--block", "1024"], "-n: '1.5' is not a whole number"),
    (["autotune", "--configs", "-1", "--runs", "20", "--ms", "0.2", "--saved-us", "5", "--calls", "100"],
     "counts and times must be non-negative"),
    (["autotune", "--configs", "12", "--runs", "20", "--ms", "-0.2", "--saved-us", "5", "--calls", "100"],
     "counts and times must be non-negative"),
    (["autotune", "--configs", "12", "--runs", "20", "--ms", "0.2", "--saved-us", "0", "--calls", "100"],
     "the saving positive"),
])
def test_bad_numbers_are_one_line_exit_2(args, message):
    res = run(*args)
    assert res.exit_code == 2, res.output
    assert res.stdout == ""
    assert res.stderr.startswith("profkit: error: ") and message in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "Traceback" not in res.output


def test_installed_entry_point_runs():
    import shutil
    import subprocess
    exe = shutil.which("profkit")
    if exe is None:
        pytest.skip("profkit is not on PATH")
    out = subprocess.run([exe, "estimate", "amdahl", "--share", "0.25", "--speedup", "4"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.startswith("end to end: 1 / ((1 - 0.25) + 0.25 / 4) = 1.23x\n")
    bad = subprocess.run([exe, "estimate", "amdahl", "--share", "2", "--speedup", "4"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr == "profkit: error: share p must be within 0..1, not 2.0\n"
