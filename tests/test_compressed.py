"""Compressed traces: read directly, decompressed once into a private cache keyed by content."""
from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from profkit.cli import main
from profkit.errors import ProfkitError
from profkit.read import compressed
from synth import plain

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "traces" / "micro_addnorm.sqlite.xz"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(d))
    compressed._SEEN.clear()
    yield d
    compressed._SEEN.clear()


def csv_of(path: Path) -> str:
    res = CliRunner().invoke(main, ["classify", "--by", "kernel", "--format", "csv", str(path)])
    assert res.exit_code == 0, res.output
    return res.stdout


@pytest.mark.parametrize("suffix,pack", [(".gz", gzip.compress), (".xz", lzma.compress),
                                         (".bz2", bz2.compress)])
def test_each_format_reads_as_the_plain_export(tmp_path, cache, suffix, pack):
    raw = plain(TRACE).read_bytes()
    flat = tmp_path / "t.sqlite"
    flat.write_bytes(raw)
    packed = tmp_path / f"t.sqlite{suffix}"
    packed.write_bytes(pack(raw))
    before = (hashlib.sha256(packed.read_bytes()).hexdigest(), packed.stat().st_mtime_ns)
    assert csv_of(packed) == csv_of(flat)
    assert (hashlib.sha256(packed.read_bytes()).hexdigest(), packed.stat().st_mtime_ns) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["t.sqlite", packed.name, "cache"])


def test_cache_is_keyed_by_content_not_by_name(tmp_path, cache):
    a, b = tmp_path / "a.sqlite.xz", tmp_path / "b.sqlite.xz"
    shutil.copyfile(TRACE, a)
    shutil.copyfile(TRACE, b)
    assert compressed.decompressed(a) == compressed.decompressed(b)
    assert len(list(cache.glob("*.sqlite"))) == 1
    # An edited file (same name) gets a fresh entry, never the stale copy.
    # (another trace's content, decompressed outside the cache: only a and b may have entries)
    a.write_bytes(lzma.compress(lzma.decompress((ROOT / "traces" / "micro_chain.sqlite.xz").read_bytes())))
    assert compressed.decompressed(a) != compressed.decompressed(b)
    assert len(list(cache.glob("*.sqlite"))) == 2


def test_two_runs_racing_on_one_trace_both_read_it(tmp_path, cache):
    code = ("import sys; from profkit.read.compressed import decompressed; "
            "print(decompressed(sys.argv[1]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(TRACE)], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PROFKIT_CACHE_DIR": str(cache)})
             for _ in range(4)]
    outs = {p.communicate()[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(outs) == 1 and Path(outs.pop()).read_bytes() == plain(TRACE).read_bytes()
    assert [p.name for p in cache.iterdir() if p.suffix == ".part"] == []


def test_cache_stays_under_its_bound_and_keeps_the_newest(tmp_path, cache, monkeypatch):
    names = ["micro_addnorm", "micro_chain", "micro_softmax"]
    sizes = [len(lzma.decompress((ROOT / "traces" / f"{n}.sqlite.xz").read_bytes())) for n in names]
    monkeypatch.setenv("PROFKIT_CACHE_MAX_BYTES", str(max(sizes) + 1))
    last = None
    for n in names:
        last = compressed.decompressed(ROOT / "traces" / f"{n}.sqlite.xz")
    left = list(cache.glob("*.sqlite"))
    assert left == [last] and sum(p.stat().st_size for p in left) <= max(sizes) + 1


def test_zst_without_its_package_is_one_clear_line(tmp_path, cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "zstandard", None)  # as if it were not installed
    p = tmp_path / "t.sqlite.zst"
    p.write_bytes(b"\x28\xb5\x2f\xfd" + b"\0" * 64)
    res = CliRunner().invoke(main, ["classify", str(p)])
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        f"profkit: error: {p}: reading .zst traces needs the zstandard package (pip install "
        "zstandard), or decompress it with `zstd -d`"]


def test_an_unwritable_cache_is_named(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(ro / "sub"))
    compressed._SEEN.clear()
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user who can write anywhere (root)")
        res = CliRunner().invoke(main, ["classify", str(TRACE)])
        assert res.exit_code == 2 and "set PROFKIT_CACHE_DIR to a writable folder" in res.stderr
    finally:
        ro.chmod(0o700)
        compressed._SEEN.clear()


def test_names_of_exports():
    assert compressed.trace_stem("a/rank0.sqlite.xz") == "rank0"
    assert compressed.trace_stem("rank0.sqlite") == "rank0"
    assert compressed.is_trace_name("x.SQLITE.GZ") and not compressed.is_trace_name("x.json.gz")


def test_arguments_expand_to_the_trace_files_they_name(tmp_path):
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for name in ("rank1.sqlite.xz", "rank0.sqlite", "notes.txt", "rank2.json.gz"):
        (ranks / name).write_text("x")
    (ranks / "sub").mkdir()
    (ranks / "sub" / "rank9.sqlite").write_text("x")
    lone = tmp_path / "b.sqlite"
    lone.write_text("x")
    # Files as given, a directory's exports (not its other files, not its sub-folders) sorted
    # in its place, each file once however it was named; a missing file is passed on to be named.
    got = compressed.expand_inputs([lone, str(ranks), ranks / "rank0.sqlite", "missing.sqlite",
                                    tmp_path / "." / "b.sqlite"])
    assert got == [lone, ranks / "rank0.sqlite", ranks / "rank1.sqlite.xz", Path("missing.sqlite")]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProfkitError, match=r"empty: not a file, and the directory holds no \.sqlite exports"):
        compressed.expand_inputs([lone, tmp_path / "empty"])


def _tracked_bytes() -> int:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    files = [ROOT / f for f in out.stdout.decode().split("\0") if f]
    return sum(f.stat().st_size for f in files if f.is_file())


def test_the_tracked_tree_stays_small_enough_to_travel():
    # A working tree over 64 MiB cannot be sent to a GPU machine with the code; traces are
    # committed compressed (and slimmed: scripts/tools/slim_trace.py), and the tree is kept
    # well under that: 45 MB (44.4 with fourteen first-sight programs' captures, 14 iterations
    # each, slimmed; per_sample_loss_train's 8, and the three older corpus traces that held 20-25
    # iterations cut to 14), room for what a GPU run carries beside it (its build outputs and
    # wheels, a few MB). The twenty-fourth and twenty-fifth first-sight captures fit by keeping 3
    # iterations of rl_rollout_train, accum_resnet_train and grad_accum_fp16_train (their
    # calibration still within 0.5% of the unprofiled run). Set h's three captures (4 iterations
    # each) fit by cutting efficientnet_b0_fp32_train, distilbert_finetune, handwritten_block_train
    # and tuned_gpt_train to 6-8 iterations (their top prices within 1%, their calibration's source
    # unchanged; others, such as resnet18_fp32_train, moved 5-13% and stay whole). Set i's three
    # (6, 4 and 6 iterations) fit by cutting twelve older captures to 3-12 iterations (their top
    # three prices within 2%, their calibration's source unchanged; three moved more and were cut
    # all the same: grad_checkpoint_train's third price 2.9%, gpt2_fp32_train's TF32 price 4%, and
    # generate_qwen2's graph price 5.7%, which took its static-cache pair from +17% to +8%, across
    # the page's 15% line). Set j's three (6, 6 and 14 iterations) fit by cutting ten more to 3-9
    # iterations, each within 2%. Set k's three (4 iterations each) fit by cutting nine more
    # to 5-12 iterations, each within 2%, and four inference captures to 10-12 (resnet50_fp32_infer,
    # vit_fp32_infer, resnet50_b4_infer, early_exit_sync: each within 2%; efficientnet_b0_fp32_infer,
    # bert_fp32_infer and dataloader_cnn moved 6-9% or changed calibration, and stay whole). Sets
    # l and m (six captures, 3-14 iterations) fit by dropping two rank-1 DDP traces (ddp2/ keeps a
    # step's two ranks) and cutting nine older captures to 3-6 iterations, each within 2%
    # (resnet50_fp32_train, gpt2_empty_cache, mobilenet_v3_fp32_train, compiled_step_train,
    # distilbert_finetune, efficientnet_b0_fp32_train and cpu_tokenize_infer moved more and stay
    # whole). Set o's three (10, 10 and 4 iterations) fit by cutting wgan_gp_train, speech_conformer_train,
    # swin_t_fp32_train and resnext50_fp32_train to 3-10 iterations (each within 1.2%) and keeping of
    # the Kineto trace only the events the HTA comparison reads (527 to 85 KB). Set p's two (4 and
    # 3 iterations) fit by cutting cfg_two_pass_sample, generate_qwen2, activation_offload_train,
    # mobilenet_v3_b4_infer and gpt2_empty_cache to 5-20 iterations (top prices within 1.1%; the
    # second prices of the last two moved 3.8% and 2.5%); cut to 3, vit_mha_weights_train's SDPA
    # price at its timed baseline moved from 2.23x to 1.70x, so it keeps 4. That left about 10 KB. The
    # five traces/real/generate_llama* captures of a warm-up generate() then the measured one kept
    # only the last 2 s of their set-up (scripts/tools/trim_setup.py; their windows and prices
    # unchanged, the report says the file was cut): 1.1 MB, for six first-sight captures (3-14
    # iterations, 1.4 MB). The same cut to the last 50 ms of the set-up on six more whose set-up held
    # a fifth or more of their rows (cnn_infer_compiled's compilation, grad_accum_fp16_train,
    # rl_rollout_train, generate_llama, per_sample_loss_train, moe_routing_train; every price and
    # window unchanged): 1.4 MB. Set t's packed_lstm_lm_train (10,000 runtime calls an iteration)
    # keeps 4 iterations: 0.75 MB, its three prices within 2.5% of the 14 iterations'; three
    # single-stream captures (cnn_infer_compiled, train_llama_compiled, generate_llama_static) keep
    # none of their CUDA-event records (classify's output unchanged; multi-stream captures keep
    # them: they name the cross-stream waits): 61 KB. Set u and set t's last two (five captures,
    # 3.0 MB: bilstm_crf_train keeps 3 iterations, shampoo_precond_train 4 and fasterrcnn_train 10,
    # their prices within 2% of the 14 iterations')
    # fit by cutting the set-up of 82 corpus captures to its last 50 ms (scripts/tools/trim_setup.py
    # --check: each one's judgement unchanged, or left whole); set v's three programs (their code
    # and tests, 60 KB) by blanking the kernels' mangled names, which profkit never reads, in the
    # largest captures (scripts/tools/slim_trace.py: 0.5% of each). Set v's captures (3.2 MB;
    # raft_flow_train keeps 8 iterations, its prices within 2.2% of the 14 iterations'), set w's
    # code and the compile benchmark's data fit by cutting 26 more corpus captures to fewer
    # iterations (each price within 2%), five of the HF generate() captures to 46-101 repeats of
    # their decode kernel (trim_tail --kernel-repeats, within 2%), the set-up of 19 traces/real
    # captures and three Triton fixtures to its last 50 ms (judgement unchanged;
    # train_gpt2 also to 7 iterations, within 1.2%), the DDP
    # captures of the several-captures verdict to 20 steps (its verdict and interval unchanged),
    # and the ncu CSV and nsys reference outputs of tests/data recompressed with xz. Two of set w's
    # captures (3 iterations each, 0.9 MB; scored at first sight on their 14: the cut moves their
    # prices 1-6%, each pair's verdict unchanged) fit by cutting speculative_decode_infer to 9
    # generations (0.61 MB; its prices within 1% of the 14 generations') and compiled_gpt_train to
    # 18 iterations of 24 (45 KB, within 1.1%; at 12 its calibration fell to the CPU scale's
    # floor), gzipping the kernel
    # benchmark's CSV as its sibling runs are, and dropping the raw per-iteration runs of the first
    # day's separate-run timings (their medians are the run folders of measured_h200.json.xz);
    # metric_mining_train's (4.1 MB at 14 iterations, about 1 MB at 3) does not fit. Set x's code
    # and global_prune_train's capture (3 iterations, 91 KB) fit by xz-compressing the what-if
    # timings and the first-sight record (150 KB); sam_wrn_train's and pixelcnn_sample_infer's
    # (0.4 and 8.5 MB at 14 iterations) do not. Set y's code fit by recompressing the kernel
    # benchmark's and ncu's gzipped data with xz (28 KB); its captures (1.2-3.1 MB) do not. Set z's
    # code fit by storing the analyses' twelve figures in 64-colour palettes (64 KB); its
    # captures (0.28 and 0.34 MB, trimmed) did not; DINO's (0.34 MB) fits by cutting
    # raft_flow_train to 6 iterations and speculative_decode_infer to 6 generations (0.56 MB; every
    # price of theirs within 1.5% of the 8 and 9 before, each pair's verdict unchanged). Past 45 MB,
    # traces must be trimmed harder or leave the tree.
    assert _tracked_bytes() < 45_000_000


def _trim_tail_db(tmp_path, tables: dict[str, str]):
    """An export of ``tables`` (name: columns) and PROFKIT_META in tmp_path, and trim_tail."""
    import sqlite3
    import sys
    sys.path.insert(0, str(ROOT / "scripts" / "tools"))
    import trim_tail
    db = tmp_path / "t.sqlite"
    con = sqlite3.connect(db)
    for name, cols in {**tables, "PROFKIT_META": "key TEXT, value TEXT"}.items():
        con.execute(f"CREATE TABLE {name} ({cols})")
    return db, con, trim_tail


def test_trim_tail_keeps_the_first_iterations_and_the_next_one_whole(tmp_path):
    import sqlite3
    db, con, trim_tail = _trim_tail_db(tmp_path, {"NVTX_EVENTS": 'text TEXT, start INT, "end" INT',
                                                  "CUPTI_ACTIVITY_KIND_KERNEL": 'start INT, "end" INT'})
    for i in range(5):  # ranges at 0, 100, ..., 400, each with a kernel 10 ns in
        con.execute("INSERT INTO NVTX_EVENTS VALUES ('step', ?, ?)", (100 * i, 100 * i + 90))
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?)", (100 * i + 10, 100 * i + 95))
    # a mark (no end) after the cut: a note about the whole run, such as the recorder's cost
    con.execute("INSERT INTO NVTX_EVENTS VALUES ('profkit.recorder cost_ns_per_op=5', 450, NULL)")
    con.commit()
    con.close()
    trim_tail.main(str(db), "step", 2)
    con = sqlite3.connect(db)
    assert [r[0] for r in con.execute("SELECT start FROM NVTX_EVENTS ORDER BY start")] == [0, 100, 200, 450]
    assert [r[0] for r in con.execute("SELECT start FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start")] == [10, 110, 210]
    assert con.execute("SELECT value FROM PROFKIT_META WHERE key = 'trimmed_after_ns'").fetchone() == ("300",)


def test_trim_tail_keeps_the_gpu_work_of_kept_iterations_that_ran_after_the_cut(tmp_path):
    # A GPU-bound loop with no sync: the CPU launches each iteration's kernel long before the GPU
    # runs it, so the kernels of the kept iterations start after the cut on the GPU's clock.
    import sqlite3
    db, con, trim_tail = _trim_tail_db(tmp_path, {
        "NVTX_EVENTS": 'text TEXT, start INT, "end" INT',
        "CUPTI_ACTIVITY_KIND_RUNTIME": 'start INT, "end" INT, correlationId INT',
        "CUPTI_ACTIVITY_KIND_KERNEL": 'start INT, "end" INT, correlationId INT'})
    for i in range(5):  # ranges at 0, 10, ..., 40 on the CPU; each one's kernel runs 100 ns on the GPU
        con.execute("INSERT INTO NVTX_EVENTS VALUES ('step', ?, ?)", (10 * i, 10 * i + 9))
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?)", (10 * i + 1, 10 * i + 2, i))
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?)", (100 * i + 5, 100 * i + 105, i))
    con.commit()
    con.close()
    trim_tail.main(str(db), "step", 2)
    con = sqlite3.connect(db)
    assert [r[0] for r in con.execute("SELECT start FROM NVTX_EVENTS ORDER BY start")] == [0, 10, 20]
    assert [r[0] for r in con.execute("SELECT correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME")] == [0, 1, 2]
    # cut by the GPU's own clock, only the first kernel would have stayed
    assert [r[0] for r in con.execute("SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start")] == [0, 1, 2]


def test_trim_setup_check_keeps_a_cut_only_where_the_judgement_holds(tmp_path):
    # a committed capture whose set-up was cut to its last 50 ms: a cut to 20 ms leaves every
    # price and the window as they were and is kept; a cut into the window's first iteration
    # changes them, and the trace is left byte for byte as it was, exit 1
    src = ROOT / "traces" / "corpus" / "rl_rollout_train.sqlite.xz"
    db = tmp_path / "rl.sqlite"
    with lzma.open(src) as f, open(db, "wb") as g:
        shutil.copyfileobj(f, g)
    tool = [sys.executable, str(ROOT / "scripts" / "tools" / "trim_setup.py"), "--check"]
    whole = db.stat().st_size
    ok = subprocess.run([*tool, str(db), "auto", "20"], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0 and "its judgement is unchanged" in ok.stdout
    cut = db.read_bytes()
    assert len(cut) < whole
    bad = subprocess.run([*tool, str(db), "auto", "0.001"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 1 and "left as it was: the cut changes its judgement at" in bad.stdout
    assert db.read_bytes() == cut
    assert not [p for p in tmp_path.iterdir() if p.name != "rl.sqlite"]
