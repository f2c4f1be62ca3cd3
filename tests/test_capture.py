"""`profkit capture` without Nsight: fake nsys/ncu executables (via $PROFKIT_NSYS/$PROFKIT_NCU)
that run the app and write a tiny SQLite, so the whole flow runs on any machine."""
from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import profkit
from profkit.capture import runner as cap
from profkit.capture import nsys_locate

ROOT = Path(__file__).resolve().parent.parent


def _default_sigint() -> None:
    # A shell that starts a job in the background sets SIGINT to "ignore", and children inherit
    # it: the Ctrl-C these tests send would then reach nobody.
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _capture_command():
    # profkit.cli registers classify too; keep these tests independent of it.
    if not (Path(profkit.__file__).parent / "cli" / "classify.py").exists() \
            and "profkit.cli.classify" not in sys.modules:
        stub = types.ModuleType("profkit.cli.classify")
        stub.classify = click.command("classify")(lambda: None)
        sys.modules["profkit.cli.classify"] = stub
    from profkit.cli.capture import capture
    return capture


def _runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:  # click >= 8.2 keeps stderr apart already
        return CliRunner()


FAKE_NSYS = r'''#!{python}
import json, os, signal, sqlite3, subprocess, sys
signal.signal(signal.SIGINT, lambda *a: None)  # like nsys: Ctrl-C ends the app, then it writes
argv = sys.argv[1:]
log = os.environ.get("FAKE_LOG")
if log:
    with open(log, "a") as fh:
        fh.write(json.dumps(["nsys", *argv]) + "\n")
if argv[:1] == ["--version"]:
    print("NVIDIA Nsight Systems version 2025.3.1-fake")
    sys.exit(0)
mode = os.environ.get("FAKE_NSYS_MODE", "ok")

def write_sqlite(path):
    con = sqlite3.connect(path)
    con.executescript("""
    CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
    CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER,
        globalPid INTEGER, correlationId INTEGER, demangledName INTEGER, shortName INTEGER,
        streamId INTEGER);
    CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, globalTid INTEGER,
        correlationId INTEGER);
    CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER, text TEXT,
        globalTid INTEGER, textId INTEGER);
    """)
    kernels = json.loads(os.environ.get("FAKE_KERNELS", '[["void k_add<float>(int)", "k_add", null]]'))
    pid = 1234 << 24
    tid = pid + 1234
    names = {{}}
    def sid(s):
        if s not in names:
            names[s] = len(names) + 1
            con.execute("INSERT INTO StringIds VALUES (?, ?)", (names[s], s))
        return names[s]
    t = 1000
    for i, (dem, short, rng) in enumerate(kernels):
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?)", (t, t + 5, tid, i + 1))
        if rng:
            con.execute("INSERT INTO NVTX_EVENTS VALUES (?,?,59,?,?,NULL)", (t - 1, t + 6, rng, tid))
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?,?)",
                    (t + 10, t + 20, 0, pid, i + 1, sid(dem), sid(short), 7))
        t += 100
    con.commit()
    con.close()

if argv[:1] == ["export"]:
    out = argv[argv.index("-o") + 1]
    write_sqlite(out)
    sys.exit(0)
assert argv[0] == "profile", argv
base = argv[argv.index("-o") + 1]
app = argv[argv.index("profkit.capture.bootstrap") - 2:]
rc = subprocess.call(app)
if mode == "qdstrm":
    open(base + ".qdstrm", "wb").write(b"qdstrm")
    print("Unable to retrieve the importer version", file=sys.stderr)
    sys.exit(1)
if mode == "none":
    sys.exit(1)
open(base + ".nsys-rep", "wb").write(b"fake report")
if mode == "ok":
    write_sqlite(base + ".sqlite")
sys.exit(rc)
'''

FAKE_NCU = r'''#!{python}
import json, os, subprocess, sys
argv = sys.argv[1:]
log = os.environ.get("FAKE_LOG")
if log:
    with open(log, "a") as fh:
        fh.write(json.dumps(["ncu", *argv]) + "\n")
if argv[:1] == ["--version"]:
    print("NVIDIA (R) Nsight Compute Command Line Profiler\nVersion 2025.3.1.0 (fake)")
    sys.exit(0)
if argv[:1] == ["--query-metrics"]:
    sys.exit(1)
if argv[:1] == ["--import"]:
    sys.stdout.write(open(os.environ["FAKE_NCU_CSV"]).read())
    sys.exit(0)
base = argv[argv.index("--export") + 1]
app = argv[argv.index("profkit.capture.bootstrap") - 2:]
rc = subprocess.call(app)
open(base + ".ncu-rep", "wb").write(b"fake ncu report")
sys.exit(rc)
'''


def _write_exe(path: Path, text: str) -> Path:
    path.write_text(text.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def tools(tmp_path, monkeypatch):
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    nsys = _write_exe(bindir / "nsys", FAKE_NSYS)
    ncu = _write_exe(bindir / "ncu", FAKE_NCU)
    log = tmp_path / "tool_log.jsonl"
    monkeypatch.setenv("PROFKIT_NSYS", str(nsys))
    monkeypatch.setenv("PROFKIT_NCU", str(ncu))
    monkeypatch.setenv("FAKE_LOG", str(log))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    ns = types.SimpleNamespace(nsys=nsys, ncu=ncu, log=log, work=work, tmp=tmp_path)

    def calls():
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines()]
    ns.calls = calls
    return ns


def _script(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body))
    return path


def _invoke(args, **kw):
    result = _runner().invoke(_capture_command(), args, catch_exceptions=False, **kw)
    return result


# --- bad input: one line, exit 2 ---------------------------------------------------------------------
def test_script_not_found(tools):
    r = _invoke(["nope.py"])
    assert r.exit_code == 2
    assert r.stderr == "profkit: error: script not found: nope.py\n"
    assert tools.calls() == []


def test_not_a_python_file(tools):
    (tools.work / "data.txt").write_text("hello\n")
    r = _invoke(["data.txt"])
    assert r.exit_code == 2
    assert r.stderr == ("profkit: error: data.txt is not a Python script: expected a .py file "
                        "(or a file starting with a #!...python line)\n")


def test_directory_is_not_a_script(tools):
    (tools.work / "pkg").mkdir()
    r = _invoke(["pkg"])
    assert r.exit_code == 2
    assert r.stderr == "profkit: error: pkg is a directory, not a Python script\n"


def test_python_shebang_without_py_suffix_is_accepted(tools):
    _script(tools.work / "run_me", "#!/usr/bin/env python3\nprint('hi')\n")
    r = _invoke(["run_me"])
    assert r.exit_code == 0, r.stderr
    assert (tools.work / "run_me.sqlite").is_file()


def test_nsys_missing(tools, monkeypatch):
    _script(tools.work / "s.py", "print('x')\n")
    monkeypatch.delenv("PROFKIT_NSYS")
    monkeypatch.setenv("PATH", str(tools.tmp / "empty"))
    monkeypatch.setattr(nsys_locate, "NSYS_PLACES", [])
    r = _invoke(["s.py"])
    assert r.exit_code == 2
    assert r.stderr == (
        "profkit: error: nsys (Nsight Systems CLI) not found on PATH, in PROFKIT_NSYS or in "
        "/opt/nvidia/nsight-systems, /usr/local/cuda/bin, "
        "/opt/nvidia/nsight-compute/*/host/target-linux-x64: install Nsight Systems "
        "(https://developer.nvidia.com/nsight-systems, or `apt-get install nsight-systems-cli` "
        "from NVIDIA's CUDA repository), put nsys on PATH or set PROFKIT_NSYS=/path/to/nsys\n")
    assert not (tools.work / "s.sqlite").exists()


def test_profkit_nsys_pointing_nowhere(tools, monkeypatch):
    _script(tools.work / "s.py", "print('x')\n")
    monkeypatch.setenv("PROFKIT_NSYS", "/no/such/nsys")
    r = _invoke(["s.py"])
    assert r.exit_code == 2
    assert r.stderr == ("profkit: error: PROFKIT_NSYS=/no/such/nsys is not an executable nsys; "
                        "point it at the nsys binary or unset it\n")


def test_nsys_found_in_install_place(tmp_path, monkeypatch):
    place = tmp_path / "opt" / "nsight-systems" / "2025.3.1" / "bin"
    place.mkdir(parents=True)
    old = tmp_path / "opt" / "nsight-systems" / "2024.1.1" / "bin"
    old.mkdir(parents=True)
    for d in (place, old):
        _write_exe(d / "nsys", "#!/bin/sh\n")
    monkeypatch.delenv("PROFKIT_NSYS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(nsys_locate, "NSYS_PLACES",
                        [str(tmp_path / "opt" / "nsight-systems" / "*" / "bin" / "nsys")])
    assert nsys_locate.find_nsys() == str(place / "nsys")


def test_nsys_on_path_and_env_dir(tmp_path, monkeypatch):
    d = tmp_path / "bin"
    d.mkdir()
    _write_exe(d / "nsys", "#!/bin/sh\n")
    monkeypatch.delenv("PROFKIT_NSYS", raising=False)
    monkeypatch.setenv("PATH", str(d))
    assert nsys_locate.find_nsys() == str(d / "nsys")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("PROFKIT_NSYS", str(d))  # a directory holding nsys works too
    assert nsys_locate.find_nsys() == str(d / "nsys")


def test_output_exists_without_force(tools):
    _script(tools.work / "s.py", "print('x')\n")
    (tools.work / "s.sqlite").write_text("old")
    r = _invoke(["s.py"])
    assert r.exit_code == 2
    assert r.stderr == (f"profkit: error: output {tools.work / 's.sqlite'} exists; pass --force "
                        "to replace it or -o to name another\n")
    assert (tools.work / "s.sqlite").read_text() == "old"
    r = _invoke(["--force", "s.py"])
    assert r.exit_code == 0, r.stderr
    assert sqlite3.connect(tools.work / "s.sqlite").execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0] == 1


def test_output_nsys_rep_exists_without_force(tools):
    _script(tools.work / "s.py", "print('x')\n")
    (tools.work / "s.nsys-rep").write_text("old")
    r = _invoke(["s.py"])
    assert r.exit_code == 2
    assert r.stderr.startswith(f"profkit: error: output {tools.work / 's.nsys-rep'} exists")


def test_output_dir_missing(tools):
    _script(tools.work / "s.py", "print('x')\n")
    r = _invoke(["-o", "nodir/out.sqlite", "s.py"])
    assert r.exit_code == 2
    assert r.stderr == "profkit: error: output directory nodir does not exist\n"


def test_output_dir_is_a_file(tools):
    _script(tools.work / "s.py", "print('x')\n")
    (tools.work / "afile").write_text("x")
    r = _invoke(["-o", "afile/out.sqlite", "s.py"])
    assert r.exit_code == 2
    assert r.stderr == "profkit: error: output directory afile is not a directory\n"


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root can write to read-only directories")
def test_output_dir_not_writable(tools):
    _script(tools.work / "s.py", "print('x')\n")
    ro = tools.work / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        r = _invoke(["-o", "ro/out.sqlite", "s.py"])
    finally:
        ro.chmod(0o700)
    assert r.exit_code == 2
    assert r.stderr == "profkit: error: output directory ro is not writable (Permission denied)\n"


def test_output_dir_not_writable_probe(tools, monkeypatch):
    """The writability check really tries to create a file (os.access lies for root)."""
    _script(tools.work / "s.py", "print('x')\n")

    def deny(*a, **k):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(cap.tempfile, "mkstemp", deny)
    r = _invoke(["s.py"])
    assert r.exit_code == 2
    assert r.stderr == (f"profkit: error: output directory {tools.work} is not writable "
                        "(Permission denied)\n")


# --- the whole flow ----------------------------------------------------------------------------------
def test_argv_passed_to_nsys_no_shell(tools):
    name = "my script 'q' \"x\".py"
    out_json = tools.tmp / "argv.json"
    _script(tools.work / name, f"""
        import json, os, sys
        json.dump({{"argv": sys.argv, "name": __name__, "path0": sys.path[0]}},
                  open({str(out_json)!r}, "w"))
    """)
    args = ["a b", "it's", '"quoted"', "--flag", "$HOME", "*"]
    r = _invoke(["--nsys-args", "--delay 0 --sample none --foo 'a b'", name, *args])
    assert r.exit_code == 0, r.stderr
    seen = json.loads(out_json.read_text())
    assert seen["argv"] == [name, *args]
    assert seen["name"] == "__main__"
    assert seen["path0"] == str(tools.work)
    (call,) = [c for c in tools.calls() if c[1] == "profile"]
    assert call[:11] == ["nsys", "profile", "-t", "cuda,nvtx,cublas,cudnn", "-s", "none",
                         "--cpuctxsw", "none", "--cuda-graph-trace=node", "--export", "sqlite"]
    assert call[11] == "-o"
    tmp_base = Path(call[12])
    assert tmp_base.parent == tools.work
    assert tmp_base.name.startswith(".my script 'q' \"x\".profkit-tmp-")
    assert call[13:19] == ["--delay", "0", "--sample", "none", "--foo", "a b"]
    assert call[19:22] == [sys.executable, "-m", "profkit.capture.bootstrap"]
    assert call[22] == "--exit-code-file"
    assert call[24:] == ["--", name, *args]
    out = tools.work / "my script 'q' \"x\".sqlite"
    assert out.is_file()
    assert (tools.work / "my script 'q' \"x\".nsys-rep").is_file()
    leftovers = [p.name for p in tools.work.iterdir() if "profkit-tmp" in p.name]
    assert leftovers == []
    meta = dict(sqlite3.connect(out).execute("SELECT key, value FROM PROFKIT_META").fetchall())
    assert meta["nsys_version"] == "NVIDIA Nsight Systems version 2025.3.1-fake"
    assert meta["script_exit_code"] == "0"
    assert "--nsys-args" in meta["command"] and meta["command"].startswith("profkit capture")
    assert meta["nsys_command"].startswith(str(tools.nsys) + " profile -t cuda,nvtx,cublas,cudnn")
    assert meta["profkit_version"] == profkit.__version__
    assert meta["captured_at"].endswith("+00:00")


def test_default_output_goes_to_traces_dir(tools):
    (tools.work / "traces").mkdir()
    _script(tools.work / "train.py", "print('training')\n")
    r = _invoke(["train.py"])
    assert r.exit_code == 0, r.stderr
    assert (tools.work / "traces" / "train.sqlite").is_file()
    assert (tools.work / "traces" / "train.nsys-rep").is_file()
    assert f"profkit: wrote {tools.work / 'traces' / 'train.sqlite'}" in r.stderr
    assert "profkit: [1/2] calibration run (no profiler): " in r.stderr
    assert "profkit: [2/2] nsys profile: " in r.stderr
    assert "profkit: [2/2] nsys profile: finished in " in r.stderr


def test_output_name_gets_sqlite_suffix(tools):
    _script(tools.work / "s.py", "print('x')\n")
    r = _invoke(["-o", "run1", "s.py"])
    assert r.exit_code == 0, r.stderr
    assert (tools.work / "run1.sqlite").is_file()
    assert (tools.work / "run1.nsys-rep").is_file()


def test_script_exit_code_passed_through(tools):
    _script(tools.work / "fails.py", "import sys\nprint('partial work')\nsys.exit(3)\n")
    r = _invoke(["fails.py"])
    assert r.exit_code == 3
    out = tools.work / "fails.sqlite"
    assert out.is_file()
    assert (f"profkit: the script exited with status 3; {out} holds what ran until then"
            in r.stderr)
    meta = dict(sqlite3.connect(out).execute("SELECT key, value FROM PROFKIT_META").fetchall())
    assert meta["script_exit_code"] == "3"


def test_script_exception_gives_status_1(tools):
    _script(tools.work / "boom.py", "raise RuntimeError('boom')\n")
    r = _invoke(["boom.py"])
    assert r.exit_code == 1
    assert (tools.work / "boom.sqlite").is_file()


def test_qdstrm_only_failure(tools, monkeypatch):
    _script(tools.work / "s.py", "print('x')\n")
    monkeypatch.setenv("FAKE_NSYS_MODE", "qdstrm")
    r = _invoke(["s.py"])
    assert r.exit_code == 2
    qdstrm = str(tools.work / "s.qdstrm")   # kept under the output's name, for QdstrmImporter
    assert Path(qdstrm).read_bytes() == b"qdstrm"
    assert r.stderr.splitlines()[-1] == (
        f"profkit: error: nsys wrote only {qdstrm} and no .nsys-rep: its importer "
        "(QdstrmImporter) could not run (\"Unable to retrieve the importer version\" usually "
        "means libdw.so.1 is missing). Install it (`apt-get install libdw1`, or put a libdw.so.1 "
        "on LD_LIBRARY_PATH) and capture again, or convert by hand with "
        f"`QdstrmImporter -i {qdstrm}` then `nsys export --type sqlite`")
    assert not (tools.work / "s.sqlite").exists()


def test_no_report_at_all(tools, monkeypatch):
    _script(tools.work / "s.py", "print('x')\n")
    monkeypatch.setenv("FAKE_NSYS_MODE", "none")
    r = _invoke(["s.py"])
    assert r.exit_code == 2
    assert r.stderr.splitlines()[-1] == ("profkit: error: nsys wrote no report; see its "
                                         "messages above")


def test_report_without_sqlite_is_exported(tools, monkeypatch):
    _script(tools.work / "s.py", "print('x')\n")
    monkeypatch.setenv("FAKE_NSYS_MODE", "rep_only")
    r = _invoke(["s.py"])
    assert r.exit_code == 0, r.stderr
    exports = [c for c in tools.calls() if c[1] == "export"]
    assert exports and exports[0][:5] == ["nsys", "export", "--type", "sqlite",
                                          "--force-overwrite"]
    assert (tools.work / "s.sqlite").is_file()


def test_bad_nsys_args_quote(tools):
    _script(tools.work / "s.py", "print('x')\n")
    r = _invoke(["--nsys-args", "--foo 'unterminated", "s.py"])
    assert r.exit_code == 2
    assert r.stderr == ("profkit: error: --nsys-args: cannot split \"--foo 'unterminated\" "
                        "(No closing quotation)\n")


# --- --ncu -------------------------------------------------------------------------------------------
NCU_CSV = (
    '"ID","Process ID","Process Name","Host Name",'
    '"thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg",'
    '"Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC",'
    '"dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum",'
    '"sm__sass_thread_inst_executed_op_ffma_pred_on.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed"\n'
    '"","","","","","","","","","","","","Mbyte","Kbyte","us","inst","%"\n'
    '"0","777","python3","host","777  ""<default domain>:step:none:none:none:none:none:none"" ",'
    '"void k_add<float>(int)","1","7","(128, 1, 1)","(4, 1, 1)","0","9.0",'
    '"1.5","2","3.25","1,000","12.5"\n'
)


def test_ncu_pass_merges_counters(tools, monkeypatch):
    csv = tools.tmp / "fake_ncu.csv"
    csv.write_text(NCU_CSV)
    monkeypatch.setenv("FAKE_NCU_CSV", str(csv))
    monkeypatch.setenv("FAKE_KERNELS", json.dumps([["void k_add<float>(int)", "k_add", "step"]]))
    _script(tools.work / "s.py", "print('x')\n")
    r = _invoke(["--ncu", "--ncu-range", "step", "--ncu-count", "5", "s.py", "arg"])
    assert r.exit_code == 0, r.stderr
    (prof,) = [c for c in tools.calls() if c[0] == "ncu" and "--export" in c]
    i = prof.index("--export")
    assert prof[1:i] == [
        "--clock-control", "none", "--target-processes", "all", "--nvtx",
        "--nvtx-include", "step/", "--launch-count", "5",
        "--section", "SpeedOfLight", "--section", "MemoryWorkloadAnalysis",
        "--section", "ComputeWorkloadAnalysis", "--section", "LaunchStats",
        "--section", "Occupancy", "--metrics", ",".join(cap.NCU_METRICS)]
    assert prof[i + 2] == "--force-overwrite"
    assert prof[-2:] == ["s.py", "arg"]
    (imp,) = [c for c in tools.calls() if c[:2] == ["ncu", "--import"]]
    assert imp[2].endswith(".ncu-rep")
    assert imp[3:] == ["--csv", "--page", "raw", "--print-units", "base",
                       "--print-kernel-base", "demangled"]
    out = tools.work / "s.sqlite"
    con = sqlite3.connect(out)
    rows = con.execute("SELECT kernel_name, nvtx_range, gpu_time_ns, dram_bytes_read, "
                       "dram_bytes_write, flops_fp32, kernel_start FROM PROFKIT_NCU_METRICS").fetchall()
    assert rows == [("void k_add<float>(int)", "step", 3250.0, 1.5e6, 2000.0, 2000.0, 1010)]
    meta = dict(con.execute("SELECT key, value FROM PROFKIT_META").fetchall())
    assert meta["ncu_version"].startswith("NVIDIA (R) Nsight Compute")
    assert meta["ncu_range"] == "step"
    assert meta["ncu_merge"] == "1 of 1 ncu kernels matched to nsys kernels"
    assert (tools.work / "s.ncu-rep").is_file()
    assert (tools.work / "s.ncu.csv").read_text() == NCU_CSV
    assert "profkit: ncu: 1 of 1 ncu kernels matched to nsys kernels" in r.stderr


def test_ncu_missing(tools, monkeypatch):
    _script(tools.work / "s.py", "print('x')\n")
    monkeypatch.delenv("PROFKIT_NCU")
    monkeypatch.setenv("PATH", str(tools.tmp / "empty"))
    monkeypatch.setattr(nsys_locate, "NCU_PLACES", [])
    r = _invoke(["--ncu", "s.py"])
    assert r.exit_code == 2
    assert r.stderr.startswith("profkit: error: ncu (Nsight Compute CLI) not found on PATH")
    assert tools.calls() == []


def test_ncu_count_must_be_positive(tools):
    _script(tools.work / "s.py", "print('x')\n")
    r = _invoke(["--ncu", "--ncu-count", "0", "s.py"])
    assert r.exit_code == 2
    assert r.stderr == "profkit: error: --ncu-count must be at least 1, not 0\n"


# --- building blocks ---------------------------------------------------------------------------------
def test_build_nsys_command_is_a_list():
    cmd = cap.build_nsys_command("/x/nsys", Path("/o/.t"), ["py", "-m", "m"], ["--delay", "2"])
    assert cmd == ["/x/nsys", "profile", "-t", "cuda,nvtx,cublas,cudnn", "-s", "none",
                   "--cpuctxsw", "none", "--cuda-graph-trace=node", "--export", "sqlite",
                   "-o", "/o/.t", "--delay", "2", "py", "-m", "m"]


def test_resolve_output(tmp_path):
    s = Path("dir/train.py")
    assert cap.resolve_output(s, None, tmp_path) == tmp_path / "train.sqlite"
    (tmp_path / "traces").mkdir()
    assert cap.resolve_output(s, None, tmp_path) == tmp_path / "traces" / "train.sqlite"
    assert cap.resolve_output(s, "a/b.sqlite") == Path("a/b.sqlite")
    assert cap.resolve_output(s, "a/b.nsys-rep") == Path("a/b.sqlite")
    assert cap.resolve_output(s, "a/b") == Path("a/b.sqlite")
    assert cap.resolve_output(s, str(tmp_path)) == tmp_path / "train.sqlite"


def test_ncu_range_expression():
    from profkit.capture.ncu_merge import ncu_range_expression
    assert ncu_range_expression("step") == "step/"
    assert ncu_range_expression("outer/inner/") == "outer/inner/"
    assert ncu_range_expression("regex:gemm.*") == "regex:gemm.*/"


# --- the bootstrap -----------------------------------------------------------------------------------
def _bootstrap(tmp_path, body, *args, aten=False):
    script = _script(tmp_path / "user.py", body)
    code = tmp_path / "code.txt"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    flag = [] if not aten else ["--aten"] if aten is True else [f"--aten={aten}"]
    cmd = [sys.executable, "-m", "profkit.capture.bootstrap", *flag,
           "--exit-code-file", str(code), "--", str(script), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    return res, code.read_text() if code.exists() else None


def test_bootstrap_runs_script_as_main(tmp_path):
    res, code = _bootstrap(tmp_path, """
        import sys
        def main():
            print("argv", sys.argv[1:], __name__)
        if __name__ == "__main__":
            main()
    """, "x y", "--z")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "argv ['x y', '--z'] __main__\n"
    assert code == "0"


def test_bootstrap_exit_codes(tmp_path):
    res, code = _bootstrap(tmp_path, "import sys\nsys.exit(7)\n")
    assert (res.returncode, code) == (7, "7")
    res, code = _bootstrap(tmp_path, "import sys\nsys.exit('bad thing')\n")
    assert (res.returncode, code) == (1, "1")
    assert res.stderr == "bad thing\n"
    res, code = _bootstrap(tmp_path, "def f():\n    raise ValueError('nope')\nf()\n")
    assert (res.returncode, code) == (1, "1")
    assert "ValueError: nope" in res.stderr
    assert "_run_script" not in res.stderr and "runpy" not in res.stderr
    assert 'user.py", line 3' in res.stderr


def test_bootstrap_aten_wraps_emit_nvtx(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from profkit.capture import bootstrap as _run_script
    seen = {}

    class FakeEmit:
        def __init__(self, record_shapes=False):
            seen["record_shapes"] = record_shapes

        def __enter__(self):
            seen["entered"] = True

        def __exit__(self, *a):
            seen["exited"] = True

    monkeypatch.setattr(torch.autograd.profiler, "emit_nvtx", FakeEmit)
    script = _script(tmp_path / "u.py", "import sys\nRESULT = sys.argv\n")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert _run_script.run(str(script), ["a"], aten="emit_nvtx") == 0
    assert seen == {"record_shapes": True, "entered": True, "exited": True}
    assert sys.argv == [str(script), "a"]


def test_bootstrap_aten_uses_the_recorder_by_default(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from profkit.capture import bootstrap as _run_script
    from profkit.capture import recorder
    texts, marks = [], []
    monkeypatch.setattr(recorder, "nvtx_functions", lambda: (texts.append, lambda: None))
    monkeypatch.setattr(recorder, "nvtx_mark", lambda: marks.append)
    script = _script(tmp_path / "u.py", "import torch\nRESULT = torch.ones(3) + 1\n")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert _run_script.run(str(script), [], aten=True) == 0
    # The probe of the recorder's own cost records its adds first (4-element tensors); the
    # script's add follows. An add is a producer of the pairs the bundled kernels fuse: it
    # carries its op_id.
    probe = [t for t in texts if t.startswith("aten::add.Tensor, sizes = [[4], [4], []]")]
    assert len(probe) == 800
    script_ops = [t for t in texts if t.startswith("aten::add.Tensor, sizes = [[3], [], []], op_id = ")]
    assert len(script_ops) == 1 and " pk = in=fp32,-*2 " in script_ops[0], texts[-3:]
    # When the script ends, the recorder's measured host cost per recorded op of the script
    assert len(marks) == 1 and marks[0].startswith("profkit.recorder cost_ns_per_op=")
    assert int(marks[0].split("=")[1]) > 0


# --- Ctrl-C ------------------------------------------------------------------------------------------
def test_ctrl_c_keeps_partial_trace(tools):
    """SIGINT to the terminal's process group: the script stops, nsys writes, profkit keeps it."""
    import signal
    import time
    _script(tools.work / "slow.py", """
        import time
        print("ready", flush=True)
        time.sleep(60)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "profkit", "capture", "--no-calibrate", "slow.py"],
                            cwd=tools.work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_sigint)
    try:
        assert proc.stdout.readline() == "ready\n"
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert (tools.work / "slow.sqlite").is_file()
    assert f"profkit: interrupted: {tools.work / 'slow.sqlite'} holds what ran until then" in err
    assert "Traceback" not in err.replace("KeyboardInterrupt", "")


def test_ctrl_c_in_the_calibration_run_captures_nothing(tools):
    """Ctrl-C while the script runs unprofiled: exit 130, one line, no trace, no temporary files."""
    import signal
    import time
    _script(tools.work / "slow.py", """
        import time
        print("ready", flush=True)
        time.sleep(60)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "profkit", "capture", "slow.py"],
                            cwd=tools.work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_sigint)
    try:
        assert proc.stdout.readline() == "ready\n"
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "profkit: interrupted in the calibration run, before profiling: nothing was captured" in err
    assert sorted(p.name for p in tools.work.iterdir()) == ["slow.py"]


def test_calibration_times_the_ranges_into_the_trace(tools):
    _script(tools.work / "steps.py", """
        import time
        import nvtx
        for i in range(6):
            with nvtx.annotate("step"):
                time.sleep(0.003)
        nvtx.push_range("tail")
        nvtx.pop_range()
    """)
    r = _invoke(["steps.py"])
    assert r.exit_code == 0, r.stderr
    meta = dict(sqlite3.connect(tools.work / "steps.sqlite").execute(
        "SELECT key, value FROM PROFKIT_META").fetchall())
    cal = json.loads(meta["calibration"])
    assert cal["format"] == "profkit-calibration/1" and cal["exit_code"] == 0
    assert [x["name"] for x in cal["ranges"]] == ["step"] * 6 + ["tail"]
    assert all(x["end_ns"] - x["start_ns"] >= 3_000_000 for x in cal["ranges"][:6])
    assert all(x["gpu_ns"] is None for x in cal["ranges"])  # no CUDA here
    r = _invoke(["--no-calibrate", "-o", "plain.sqlite", "steps.py"])
    assert r.exit_code == 0 and "calibration run" not in r.stderr and "[1/1] nsys profile" in r.stderr
    meta = dict(sqlite3.connect(tools.work / "plain.sqlite").execute(
        "SELECT key, value FROM PROFKIT_META").fetchall())
    assert "calibration" not in meta and "--no-calibrate" in meta["command"]
    r = _invoke(["--calibrate-runs", "2", "-o", "twice.sqlite", "steps.py"])
    assert r.exit_code == 0, r.stderr
    assert "[1/3] calibration run 1 of 2 (no profiler)" in r.stderr and "[3/3] nsys profile" in r.stderr
    meta = dict(sqlite3.connect(tools.work / "twice.sqlite").execute(
        "SELECT key, value FROM PROFKIT_META").fetchall())
    runs = json.loads(meta["calibration"])["runs"]
    assert len(runs) == 2 and all([x["name"] for x in c["ranges"]][:6] == ["step"] * 6 for c in runs)
    assert "--calibrate-runs 2" in meta["command"]
    r = _invoke(["--calibrate-runs", "0", "steps.py"])
    assert r.exit_code == 2 and "--calibrate-runs" in r.stderr and "Traceback" not in r.stderr


def test_calibration_hooks_torch_nvtx_when_the_script_imports_it(tmp_path):
    # A stand-in torch (no CUDA) on the path: the recorder must neither import it first (the
    # script's start-up would change by seconds) nor miss the ranges of a script that does.
    fake = tmp_path / "lib" / "torch"
    (fake / "cuda").mkdir(parents=True)
    (fake / "__init__.py").write_text("from . import cuda\n")
    (fake / "cuda" / "__init__.py").write_text(
        "from . import nvtx\ndef is_initialized():\n    return False\n")
    (fake / "cuda" / "nvtx.py").write_text(
        "def range_push(msg):\n    return 0\ndef range_pop():\n    return 0\n")
    probe = _script(tmp_path / "probe.py", """
        import sys
        before = "torch" in sys.modules
        import torch
        for i in range(3):
            torch.cuda.nvtx.range_push("step")
            torch.cuda.nvtx.range_push("inner")
            torch.cuda.nvtx.range_pop()
            torch.cuda.nvtx.range_pop()
        print(before)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "lib"), str(ROOT)])}
    res = subprocess.run([sys.executable, "-m", "profkit.capture.bootstrap", "--calibrate",
                          str(tmp_path / "cal.json"), str(probe)],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "False\n"
    cal = json.loads((tmp_path / "cal.json").read_text())
    assert [x["name"] for x in cal["ranges"]] == ["step"] * 3


# --- profkit peaks without a GPU -----------------------------------------------------------------
def _peaks_command():
    _capture_command()
    from profkit.cli.peaks import peaks
    return peaks


def test_peaks_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    r = _runner().invoke(_peaks_command(), ["-o", "x.json"], catch_exceptions=False)
    assert r.exit_code == 2
    assert r.stderr.startswith("profkit: error: profkit peaks needs PyTorch with CUDA "
                               "(import torch failed: ")
    assert len(r.stderr.splitlines()) == 1


def test_peaks_without_cuda(monkeypatch):
    fake = types.ModuleType("torch")
    fake.__version__ = "9.9-fake"
    fake.cuda = types.SimpleNamespace(is_available=lambda: False)
    monkeypatch.setitem(sys.modules, "torch", fake)
    r = _runner().invoke(_peaks_command(), [], catch_exceptions=False)
    assert r.exit_code == 2
    assert r.stderr == ("profkit: error: profkit peaks needs a CUDA GPU: "
                        "torch.cuda.is_available() is False (torch 9.9-fake)\n")


def test_aten_flag_reaches_bootstrap(tools):
    _script(tools.work / "s.py", "print('x')\n")
    r = _invoke(["--aten", "s.py"])
    (call,) = [c for c in tools.calls() if c[1] == "profile"]
    i = call.index("profkit.capture.bootstrap")
    assert call[i + 1] == "--aten"
    meta = dict(sqlite3.connect(tools.work / "s.sqlite").execute(
        "SELECT key, value FROM PROFKIT_META").fetchall())
    assert (meta["aten"], meta["aten_source"]) == ("1", "recorder")
    r = _invoke(["--aten", "--aten-source", "emit_nvtx", "--force", "s.py"])
    call = [c for c in tools.calls() if c[1] == "profile"][-1]
    assert call[call.index("profkit.capture.bootstrap") + 1] == "--aten=emit_nvtx"
    meta = dict(sqlite3.connect(tools.work / "s.sqlite").execute(
        "SELECT key, value FROM PROFKIT_META").fetchall())
    assert meta["aten_source"] == "emit_nvtx"
    # CPU-only torch here: emit_nvtx cannot start, which is said in one line (status 2)
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        assert r.exit_code == 2
        assert (tools.work / "s.sqlite").is_file()


def test_bootstrap_aten_without_cuda_is_one_line(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("has CUDA")
    res, code = _bootstrap(tmp_path, "print('never')\n", aten="emit_nvtx")
    assert (res.returncode, code) == (2, "2")
    assert res.stdout == ""
    assert res.stderr.startswith("profkit: error: --aten: torch.autograd.profiler.emit_nvtx "
                                 "could not start (")
    assert len(res.stderr.splitlines()) == 1
    try:
        import nvtx  # noqa: F401
    except ImportError:  # the recorder needs CUDA's NVTX binding or the nvtx package
        res, code = _bootstrap(tmp_path, "print('never')\n", aten=True)
        assert (res.returncode, code) == (2, "2")
        assert res.stderr == ("profkit: error: --aten: the aten recorder could not start "
                              "(RuntimeError: no NVTX to write to: this torch has no CUDA NVTX "
                              "binding and the nvtx package is not installed)\n")


def test_ncu_csv_that_cannot_be_merged_keeps_the_trace(tools, monkeypatch):
    csv = tools.tmp / "bad.csv"
    csv.write_text("not,a,raw,page\n")
    monkeypatch.setenv("FAKE_NCU_CSV", str(csv))
    _script(tools.work / "s.py", "print('x')\n")
    r = _invoke(["--ncu", "s.py"])
    assert r.exit_code == 0, r.stderr
    assert (tools.work / "s.sqlite").is_file()
    assert "profkit: ncu counters not merged: " in r.stderr
    assert f"profkit capture --merge-ncu {tools.work / 's.ncu.csv'} {tools.work / 's.sqlite'}" \
        in r.stderr


# --- default ncu coverage: one steady-state iteration --------------------------------------------------
def test_ncu_without_range_profiles_one_steady_state_iteration(tools, monkeypatch):
    csv = tools.tmp / "fake_ncu.csv"
    csv.write_text(NCU_CSV)
    monkeypatch.setenv("FAKE_NCU_CSV", str(csv))
    # three instances of the top-level range "step", one kernel each: warm-up, steady, last
    monkeypatch.setenv("FAKE_KERNELS", json.dumps([["void k_add<float>(int)", "k_add", "step"]] * 3))
    _script(tools.work / "s.py", "print('x')\n")
    r = _invoke(["--ncu", "s.py"])
    assert r.exit_code == 0, r.stderr
    (prof,) = [c for c in tools.calls() if c[0] == "ncu" and "--export" in c]
    assert "--nvtx-include" not in prof   # backward runs on another thread: no per-thread filter
    assert prof[prof.index("--launch-count") + 1] == "1"
    assert prof[prof.index("--launch-skip") + 1] == "1"
    assert "iteration 2 of 3 of the NVTX range 'step'" in r.stderr
    con = sqlite3.connect(tools.work / "s.sqlite")
    # the one profiled kernel lands on the second launch (1100 + 10), not the first
    assert con.execute("SELECT kernel_start FROM PROFKIT_NCU_METRICS").fetchall() == [(1110,)]
    meta = dict(con.execute("SELECT key, value FROM PROFKIT_META").fetchall())
    assert meta["ncu_iteration"] == "step#1" and meta["ncu_launch_skip"] == "1"


def test_ncu_without_any_repeated_range_says_so(tools, monkeypatch):
    csv = tools.tmp / "fake_ncu.csv"
    csv.write_text(NCU_CSV)
    monkeypatch.setenv("FAKE_NCU_CSV", str(csv))
    monkeypatch.setenv("FAKE_KERNELS", json.dumps([["void k_add<float>(int)", "k_add", None]]))
    _script(tools.work / "s.py", "print('x')\n")
    r = _invoke(["--ncu", "s.py"])
    assert r.exit_code == 0, r.stderr
    (prof,) = [c for c in tools.calls() if c[0] == "ncu" and "--export" in c]
    assert prof[prof.index("--launch-count") + 1] == str(cap.DEFAULT_NCU_COUNT)
    assert "no repeated top-level NVTX range" in r.stderr


def test_gpu_metrics_flags_reach_nsys(tools):
    _script(tools.work / "s.py", "print('x')\n")
    r = _invoke(["--gpu-metrics", "s.py"])
    assert r.exit_code == 0, r.stderr
    (prof,) = [c for c in tools.calls() if c[:2] == ["nsys", "profile"]]
    assert "--gpu-metrics-devices=0" in prof and "--gpu-metrics-frequency=10000" in prof
    r = _invoke(["--force", "--gpu-metrics", "--gpu-metrics-frequency", "2000", "s.py"])
    assert r.exit_code == 0, r.stderr
    assert "--gpu-metrics-frequency=2000" in [c for c in tools.calls() if c[:2] == ["nsys", "profile"]][-1]


@pytest.mark.skipif(not (Path(__file__).resolve().parents[1] / "traces" / "model_tiny_llama.sqlite.xz").exists(),
                    reason="real trace not present")
def test_choose_iteration_on_a_real_trace():
    trace = Path(__file__).resolve().parents[1] / "traces" / "model_tiny_llama.sqlite.xz"
    it = cap.choose_iteration(trace)
    # 6 forward passes: the 5th (second-to-last) is profiled, with all its kernels
    assert (it.name, it.index, it.instances) == ("forward", 4, 6)
    assert it.count == 49 and it.skip > 0 and it.start < it.end
