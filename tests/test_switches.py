"""The switches of `profkit capture --try` (profkit/capture/switches), each on CPU torch where it
can be: applied in this process through Trial.install (as the bootstrap does when the script
imports torch) and undone after each test (Trial.restore). The GPU tests skip without CUDA."""
from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")

from profkit.capture.switches import Trial, one_line  # noqa: E402
from profkit.model import Switch, parse_trial  # noqa: E402

CUDA = torch.cuda.is_available()
# The outermost module is looked for on CUDA where CUDA is available: the models go there
DEV = "cuda" if CUDA else "cpu"


@pytest.fixture
def trial():
    made = []

    def make(name: str, **options):
        t = Trial(name, {"compile_backend": None, **options})
        for s, h in t.handlers.items():
            h.prepare(t, t.reports[s])
        t.install(torch)
        made.append(t)
        return t
    yield make
    for t in reversed(made):
        t.restore()
    # a compile trial's frames stay counted in the process: the op record, tested in the same
    # worker, takes a count above 0 for a program that runs compiled code and records nothing
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is not None:
        utils.counters.clear()


class Tiny(torch.nn.Module):
    def __init__(self, n: int = 16) -> None:
        super().__init__()
        self.a = torch.nn.Linear(n, n)
        self.b = torch.nn.Linear(n, 1)

    def forward(self, x):
        return self.b(self.a(x).relu())


class Net(torch.nn.Module):
    """A conv net with a 3-D conv, to check both memory formats."""
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.conv3 = torch.nn.Conv3d(2, 2, 1)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x, v=None):
        y = self.bn(self.conv(x))
        return y if v is None else (y, self.conv3(v))


# -- the names -----------------------------------------------------------------------------------
def test_trial_names_parse_and_unknown_ones_are_named():
    assert parse_trial("tf32") == (Switch.TF32,)
    assert parse_trial("channels_last+bf16") == (Switch.CHANNELS_LAST, Switch.BF16)
    with pytest.raises(ValueError, match=r"unknown switch 'tf33'|unknown switch tf33"):
        parse_trial("tf33")
    assert one_line(RuntimeError("CUDA out of memory.\nTried to allocate")) == \
        "RuntimeError: CUDA out of memory."


# -- backends ------------------------------------------------------------------------------------
def test_tf32_sets_matmul_and_cudnn_and_legacy_reads_still_work(trial):
    before = torch.get_float32_matmul_precision()
    t = trial("tf32")
    assert torch.get_float32_matmul_precision() == "high"
    assert torch.backends.cudnn.conv.fp32_precision == "tf32"
    # a script or library reading the legacy flags must not be broken by the trial
    assert torch.backends.cuda.matmul.allow_tf32 is True and torch.backends.cudnn.allow_tf32 is True
    rec = t.record()
    assert rec == {"switch": "tf32", "applied": True,
                   "note": 'matmuls: torch.set_float32_matmul_precision("high"); cuDNN convolutions: '
                           'torch.backends.cudnn.conv.fp32_precision = "tf32"'}
    torch.set_float32_matmul_precision("highest")  # the script setting it back: said
    rec = t.record()
    assert not rec["applied"] and 'set the matmul precision back to "highest"' in rec["note"]
    t.restore()
    assert torch.get_float32_matmul_precision() == before


def test_cudnn_benchmark(trial):
    assert torch.backends.cudnn.benchmark is False
    t = trial("cudnn_benchmark")
    assert torch.backends.cudnn.benchmark is True
    assert t.record() == {"switch": "cudnn_benchmark", "applied": True,
                          "note": "torch.backends.cudnn.benchmark = True"}
    t.restore()
    assert torch.backends.cudnn.benchmark is False


# -- the optimizer -------------------------------------------------------------------------------
def test_fused_optim_sets_fused_drops_foreach_and_counts(trial):
    t = trial("fused_optim")
    m = Tiny()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=True)  # a generator, and foreach
    assert opt.defaults["fused"] is True and opt.defaults["foreach"] is None
    sgd = torch.optim.SGD(m.parameters(), 0.1, 0.9)  # positional lr and momentum kept
    assert sgd.defaults["fused"] is True and sgd.defaults["momentum"] == 0.9
    torch.optim.Adagrad(list(m.parameters()), 0.1, 0, 0, 0, 1e-10, True)  # foreach positional
    torch.optim.RMSprop(m.parameters())
    # parameter groups whose params are a generator: still all there after the check
    grouped = torch.optim.Adam([{"params": (p for p in m.parameters()), "lr": 0.01}])
    assert len(grouped.param_groups[0]["params"]) == 4 and grouped.defaults["fused"] is True
    m(torch.randn(4, 16)).sum().backward()
    opt.step()  # the fused CPU kernel runs
    rec = t.record()
    assert rec == {"switch": "fused_optim", "applied": True,
                   "note": "AdamW(fused=True) x1, SGD(fused=True) x1, Adagrad(fused=True) x1, "
                           "Adam(fused=True) x1, an explicit foreach dropped x2, RMSprop x1 (no fused "
                           "version)"}


def test_fused_optim_turned_off_is_the_optimizer_the_program_asked_for(trial):
    """Toggled off, the optimizer is the program's (foreach, its step counts on the host, no
    scaling inside the step); on, fused again; the training the same either way."""
    torch.manual_seed(0)
    m, ref = Tiny().to(DEV), Tiny().to(DEV)
    ref.load_state_dict(m.state_dict())
    t = trial("fused_optim")
    opt = torch.optim.AdamW(m.parameters(), 1e-2, foreach=True)
    t.restore()  # the reference made by torch's own constructor
    ref_opt = torch.optim.AdamW(ref.parameters(), 1e-2, foreach=True)
    assert ref_opt.defaults["fused"] is None
    seen = []
    for i, on in enumerate([True, False, False, True, False]):
        t.toggle(on)
        group = opt.param_groups[0]
        assert (group["fused"], group["foreach"], opt._step_supports_amp_scaling) == \
            ((True, None, True) if on else (None, True, False))
        x = torch.randn(4, 16, device=DEV)
        for model, o in ((m, opt), (ref, ref_opt)):
            o.zero_grad()
            model(x).pow(2).mean().backward()
            o.step()
        steps = [s["step"] for s in opt.state.values()]
        seen.append({(s.device.type, float(s)) for s in steps})
    # the counts where each path keeps them, counting on across the turns
    assert seen[1] == {("cpu", 2.0)} and seen[3] == {(torch.device(DEV).type, 4.0)} and seen[4] == {("cpu", 5.0)}
    for a, b in zip(m.parameters(), ref.parameters()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_fused_optim_already_fused_refused_and_none(trial):
    t = trial("fused_optim")
    m = Tiny()
    torch.optim.Adam(m.parameters(), fused=True)
    # fused with differentiable is refused at construction: the optimizer is made as the program asked
    opt = torch.optim.Adam(m.parameters(), differentiable=True)
    assert not opt.defaults["fused"]
    rec = t.record()
    assert not rec["applied"]
    assert rec["note"] == ("Adam already fused x1, Adam: fused=True refused (RuntimeError: `fused` "
                           "does not support `differentiable`)")
    t.restore()
    t2 = trial("fused_optim")
    assert t2.record() == {"switch": "fused_optim", "applied": False,
                           "note": "no optimizer was constructed"}


# -- data loading --------------------------------------------------------------------------------
def test_workers_fill_in_what_the_program_did_not_pass(trial):
    t = trial("workers", workers=2)
    data = torch.utils.data.TensorDataset(torch.arange(40.0).reshape(20, 2))
    dl = torch.utils.data.DataLoader(data, batch_size=4, num_workers=0)
    assert (dl.num_workers, dl.persistent_workers, dl.prefetch_factor) == (2, True, 4)
    assert dl.pin_memory is CUDA
    assert sum(len(b[0]) for b in dl) == 20  # workers really load
    kept = torch.utils.data.DataLoader(data, batch_size=4, num_workers=1, pin_memory=False,
                                       persistent_workers=False, prefetch_factor=2)
    assert (kept.num_workers, kept.persistent_workers, kept.prefetch_factor) == (1, False, 2)
    rec = t.record()
    changed = "num_workers 0 -> 2, " + ("pin_memory, " if CUDA else "") + \
        "persistent_workers, prefetch_factor 4"
    assert rec == {"switch": "workers", "applied": True,
                   "note": f"DataLoader x1: {changed}, DataLoader x1 left as it was (1 workers)"}


def test_workers_without_a_dataloader(trial):
    assert trial("workers").record() == {"switch": "workers", "applied": False, "note": "no DataLoader"}


def test_freeze_unstepped_freezes_what_no_optimizer_steps_at_the_second_step(trial):
    t = trial("freeze_unstepped")
    teacher, student = Tiny(), Tiny()
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    for i in range(3):
        loss = (student(x) - teacher(x)).pow(2).mean()
        loss.backward()
        # the teacher's backward ran in the first two steps; after the second step it stops
        assert (teacher.a.weight.grad is not None) == (i < 2), i
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert not any(p.requires_grad for p in teacher.parameters())
    assert all(p.requires_grad for p in student.parameters())
    assert t.record() == {"switch": "freeze_unstepped", "applied": True,
                          "note": "froze 4 tensors of Tiny (289 params), which no optimizer steps"}


def test_freeze_unstepped_leaves_a_program_whose_gradients_are_all_stepped(trial):
    t = trial("freeze_unstepped")
    m = Tiny()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(3):
        m(torch.randn(4, 16)).sum().backward()
        opt.step()
    assert all(p.requires_grad for p in m.parameters())
    assert t.record() == {"switch": "freeze_unstepped", "applied": False,
                          "note": "every parameter holding a gradient is stepped by an optimizer"}
    assert trial("freeze_unstepped").record()["note"] == "no optimizer stepped"


# -- debugging modes -----------------------------------------------------------------------------
def test_no_anomaly_keeps_anomaly_detection_off_whichever_way_it_is_asked_for(trial):
    t = trial("no_anomaly")
    x = torch.randn(4, 3, requires_grad=True)
    with torch.autograd.detect_anomaly():
        assert not torch.is_anomaly_enabled()
        x.exp().sum().backward()
    torch.autograd.set_detect_anomaly(True)
    assert not torch.is_anomaly_enabled()
    assert t.record() == {"switch": "no_anomaly", "applied": True, "note": "autograd anomaly detection left off x2"}
    t.restore()
    with torch.autograd.detect_anomaly():   # the program as it was once the trial is undone
        assert torch.is_anomaly_enabled()
    assert not torch.is_anomaly_enabled()
    assert trial("no_anomaly").record() == {"switch": "no_anomaly", "applied": False,
                                            "note": "autograd anomaly detection was never turned on"}


# -- the allocator -------------------------------------------------------------------------------
def test_no_empty_cache_is_a_counted_no_op(trial):
    orig = torch.cuda.empty_cache
    t = trial("no_empty_cache")
    from torch.cuda import empty_cache  # imported after the patch, as a script's import is
    for _ in range(3):
        empty_cache()
    torch.cuda.memory.empty_cache()
    assert t.record() == {"switch": "no_empty_cache", "applied": True,
                          "note": "torch.cuda.empty_cache() skipped x4"}
    t.restore()
    assert torch.cuda.empty_cache is orig


def test_expandable_segments_goes_into_the_environment(trial, monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    t = trial("expandable_segments")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128,expandable_segments:True"
    rec = t.record()
    assert rec["note"].startswith("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128,expandable_segments:True")
    if not CUDA:  # set, but nothing here starts CUDA: the trial would measure nothing
        assert rec["applied"] is False and rec["note"].endswith("; CUDA was never used")
    t.restore()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    assert trial("expandable_segments").record() == {
        "switch": "expandable_segments", "applied": False,
        "note": "PYTORCH_CUDA_ALLOC_CONF already sets expandable_segments (expandable_segments:False)"}


# -- the outermost module ------------------------------------------------------------------------
def test_bf16_autocasts_the_outermost_module_not_the_loss(trial):
    t = trial("bf16")
    m, loss_fn = Tiny().to(DEV), torch.nn.MSELoss()
    seen = []
    m.a.register_forward_hook(lambda mod, i, o: seen.append(o.dtype))
    out = m(torch.randn(4, 16, device=DEV))
    loss = loss_fn(out, torch.zeros(4, 1, device=DEV))   # called from the program too, but holds no parameters
    assert out.dtype == torch.bfloat16 and seen == [torch.bfloat16]
    assert loss.dtype == torch.float32       # outside the autocast region
    assert t.record() == {"switch": "bf16", "applied": True,
                          "note": "autocast bf16 around module Tiny (289 params)"}


def test_the_larger_module_called_later_takes_over(trial):
    t = trial("compile", compile_backend="eager")
    small, big = torch.nn.Linear(2, 2).to(DEV), Tiny(32).to(DEV)
    small(torch.randn(1, 2, device=DEV))
    big(torch.randn(1, 32, device=DEV))
    p = t.shared["outermost"]
    assert p.best() is big and small in p.compiled and big in p.compiled
    assert t.record()["note"] == ("torch.compile (backend eager) of module Linear (6 params), then module Tiny "
                                  "(1.1K params)")
    torch._dynamo.reset()


def test_bf16_and_channels_last_reach_every_module_the_program_calls(trial):
    """A GAN's step: the generator's images go into the critic, each called from the program.
    Autocast around the larger alone handed bf16 images to the critic's fp32 weights (a
    convolution refuses them); both run under autocast, and both are converted to channels_last."""
    t = trial("channels_last+bf16")
    gen = torch.nn.Sequential(torch.nn.ConvTranspose2d(8, 8, 4, 2, 1), torch.nn.Conv2d(8, 3, 3, padding=1)).to(DEV)
    crit = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 4, 2, 1), torch.nn.Flatten()).to(DEV)
    fake = gen(torch.randn(2, 8, 4, 4, device=DEV))
    score = crit(fake)
    assert fake.dtype == score.dtype == torch.bfloat16
    assert crit[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert gen[1].weight.is_contiguous(memory_format=torch.channels_last)
    note = t.record()["note"]
    assert ("autocast bf16 around module Sequential (1.3K params) and the program's other module "
            "Sequential (196 params)") in note, note
    assert "module Sequential (1.3K params) and the program's other module Sequential (196 params) to " \
           "channels_last (3 weights and buffers, 1 input tensors converted)" in note, note


def test_inference_mode_runs_the_outermost_module_without_autograd(trial):
    t = trial("inference_mode")
    m = Tiny().to(DEV)
    seen = []
    m.a.register_forward_hook(lambda mod, i, o: seen.append(torch.is_inference_mode_enabled()))
    x = torch.randn(4, 16, device=DEV)
    out = m(x)
    assert seen == [True] and out.is_inference() and not out.requires_grad
    assert not torch.is_inference_mode_enabled()           # only around the module's calls
    assert torch.allclose(out, Tiny.forward(m, x))         # the same numbers
    assert t.record() == {"switch": "inference_mode", "applied": True,
                          "note": "torch.inference_mode() around module Tiny (289 params)"}
    # a program that trains on what the module returns fails, and the trial says why
    with pytest.raises(RuntimeError, match="grad"):
        torch.nn.functional.mse_loss(m(x), torch.zeros(4, 1, device=DEV)).backward()


def test_fp32_runs_a_float64_model_in_float32_and_hands_back_float64(trial):
    torch.manual_seed(0)
    ref = Tiny().double().to(DEV)
    x = torch.randn(4, 16, device=DEV, dtype=torch.float64)
    expected = ref(x).detach()                         # before the trial: float64 throughout
    t = trial("fp32")
    m = Tiny().double().to(DEV)
    m.load_state_dict(ref.state_dict())
    param = m.a.weight
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)   # built before the first call, as programs do
    seen = []
    m.a.register_forward_hook(lambda mod, i, o: seen.append((i[0].dtype, o.dtype)))
    out = m(x)
    assert seen == [(torch.float32, torch.float32)]          # inside: float32
    assert out.dtype == torch.float64                        # outside: float64, as the program expects
    assert m.a.weight is param and param.dtype == torch.float32   # converted in place: the optimizer keeps it
    assert torch.allclose(out, expected, rtol=1e-5, atol=1e-6)    # the same numbers to float32's precision
    loss = torch.nn.functional.mse_loss(out, torch.zeros(4, 1, device=DEV, dtype=torch.float64))
    loss.backward()
    opt.step()
    assert param.grad.dtype == torch.float32 and opt.state[param]["exp_avg"].dtype == torch.float32
    assert t.record() == {"switch": "fp32", "applied": True,
                          "note": "module Tiny (289 params) in float32 (4 float64 weights and buffers, "
                                  "1 float64 input tensors converted; outputs returned as float64)"}


def test_fp32_reaches_nested_inputs_a_part_called_alone_and_tensors_made_inside(trial):
    class Enc(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = Tiny()

        def forward(self, batch):
            h0 = torch.zeros(batch["x"].shape[0], 16, device=batch["x"].device)   # the default dtype
            return self.body(batch["x"] + h0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        t = trial("fp32")
        m = Enc().to(DEV)                                           # float64 by default
        x = torch.randn(4, 16, device=DEV)
        out = m({"x": x})                                           # a dict batch
        part = m.body(torch.randn(2, 16, device=DEV))               # a part, on its own
        assert out.dtype == torch.float64 and part.dtype == torch.float64
        assert m.body.a.weight.dtype == torch.float32
        assert torch.get_default_dtype() == torch.float64           # restored after each call
        assert t.record()["applied"] is True
    finally:
        torch.set_default_dtype(default)


def test_fp32_on_a_float32_model_changes_nothing(trial):
    t = trial("fp32")
    m = Tiny().to(DEV)
    out = m(torch.randn(2, 16, device=DEV))
    assert out.dtype == torch.float32 and m.a.weight.dtype == torch.float32
    assert t.record() == {"switch": "fp32", "applied": False,
                          "note": "module Tiny (289 params): no float64 weights or inputs"}


def test_bf16_with_no_module(trial):
    note = "no module with parameters on CUDA was called" if CUDA else "no module with parameters was called"
    assert trial("bf16").record() == {"switch": "bf16", "applied": False, "note": note}


def test_channels_last_converts_weights_and_4d_and_5d_inputs(trial):
    t = trial("channels_last")
    net = Net().to(DEV)
    x, v = torch.randn(2, 3, 8, 8, device=DEV), torch.randn(1, 2, 3, 4, 4, device=DEV)
    y, w = net(x, v=v)
    assert net.conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert net.conv3.weight.is_contiguous(memory_format=torch.channels_last_3d)
    assert y.is_contiguous(memory_format=torch.channels_last)
    # the same numbers (cuDNN may pick other algorithms, in TF32, for the other layout)
    assert torch.allclose(y, Net.forward(net, x.contiguous()), atol=1e-5 if not CUDA else 1e-2)
    assert t.record() == {"switch": "channels_last", "applied": True,
                          "note": "module Net (126 params) to channels_last (2 weights and buffers, "
                                  "2 input tensors converted)"}


def test_channels_last_on_a_model_without_images(trial):
    t = trial("channels_last")
    Tiny().to(DEV)(torch.randn(2, 16, device=DEV))
    assert t.record() == {"switch": "channels_last", "applied": False,
                          "note": "module Tiny (289 params): no 4-D or 5-D weights or inputs"}


def test_compile_wraps_the_outermost_module_once_and_steps_aside_while_tracing(trial):
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    t = trial("compile", compile_backend="eager")
    m = Tiny().to(DEV)
    for _ in range(3):
        m(torch.randn(4, 16, device=DEV))
    # one graph, traced through the wrapper's own frame with no graph break
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert t.record() == {"switch": "compile", "applied": True,
                          "note": "torch.compile (backend eager) of module Tiny (289 params)"}
    torch._dynamo.reset()


def test_compile_graphs_hands_out_copies_of_the_replays_outputs(trial):
    # cudagraph trees reuse a graph's output memory at its next replay: a module called twice a
    # step (a guided denoiser, conditional then unconditional) would lose its first output
    t = trial("compile_graphs", compile_backend="eager")
    m = Tiny().to(DEV)
    patch = t.shared["outermost"]
    assert patch.is_outermost(m)          # chosen (and wrapped) without compiling anything
    replayed = torch.randn(4, 1, device=DEV)
    patch.compiled[m] = lambda *a, **k: (replayed, {"aux": replayed})
    out, extra = m(torch.randn(4, 16, device=DEV))
    assert out is not replayed and extra["aux"] is not replayed and out.data_ptr() != replayed.data_ptr()
    assert torch.equal(out, replayed) and torch.equal(extra["aux"], replayed)


def test_compile_leaves_an_already_compiled_module(trial):
    torch._dynamo.reset()
    t = trial("compile_graphs", compile_backend="eager")
    m = torch.compile(Tiny().to(DEV), backend="eager")
    m(torch.randn(4, 16, device=DEV))
    assert t.record() == {"switch": "compile_graphs", "applied": False,
                          "note": "already compiled (OptimizedModule)"}
    torch._dynamo.reset()


def test_compile_frozen_sets_freezing_for_the_run_and_puts_it_back(trial):
    import torch._inductor.config as inductor_config
    torch._dynamo.reset()
    before = inductor_config.freezing
    t = trial("compile_frozen", compile_backend="eager")
    assert inductor_config.freezing is True
    m = Tiny().to(DEV).eval()
    with torch.no_grad():
        for _ in range(2):
            m(torch.randn(4, 16, device=DEV))
    assert t.record() == {"switch": "compile_frozen", "applied": True,
                          "note": "torch.compile (backend eager, Inductor freezing) of module Tiny (289 params)"}
    t.restore()
    assert inductor_config.freezing == before
    torch._dynamo.reset()


def test_compile_frozen_is_not_applied_where_every_call_keeps_autograd_on(trial):
    # freezing changes only graphs run without gradients: with them on it would time a plain compile
    torch._dynamo.reset()
    t = trial("compile_frozen", compile_backend="eager")
    m = Tiny().to(DEV)
    m(torch.randn(4, 16, device=DEV))
    assert t.record() == {"switch": "compile_frozen", "applied": False,
                          "note": "module Tiny (289 params) was called with gradients enabled (1 call, all of "
                                  "them), where freezing does nothing (run it under torch.no_grad() or "
                                  "torch.inference_mode())"}
    torch._dynamo.reset()


def test_two_switches_in_one_trial(trial):
    t = trial("channels_last+bf16")
    y = Net().to(DEV)(torch.randn(2, 3, 8, 8, device=DEV))
    assert y.dtype == torch.bfloat16 and y.is_contiguous(memory_format=torch.channels_last)
    rec = t.record()
    assert rec["switch"] == "channels_last+bf16" and rec["applied"]
    assert rec["note"] == ("channels_last: module Net (126 params) to channels_last (2 weights and "
                           "buffers, 1 input tensors converted); bf16: autocast bf16 around module "
                           "Net (126 params)")


def test_restore_puts_module_call_back(trial):
    orig = torch.nn.Module.__call__
    t = trial("bf16")
    assert torch.nn.Module.__call__ is not orig
    t.restore()
    assert torch.nn.Module.__call__ is orig


# -- on a GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_gpu_switches_apply_on_cuda(trial):
    t = trial("bf16+fused_optim")
    m = Tiny().cuda()
    opt = torch.optim.AdamW(m.parameters(), foreach=True)
    # torch has no fused Adagrad on CUDA (its step raises): left as the program made it
    ada = torch.optim.Adagrad([{"params": (p for p in m.parameters())}])
    out = m(torch.randn(8, 16, device="cuda"))
    out.float().sum().backward()
    opt.step()
    ada.step()
    assert out.dtype == torch.bfloat16 and not ada.defaults["fused"]
    rec = t.record()
    assert rec["applied"] and "AdamW(fused=True) x1" in rec["note"]
    assert "Adagrad: fused=True refused (torch has no fused Adagrad for CUDA parameters)" in rec["note"]
    t.restore()
    t2 = trial("no_empty_cache+expandable_segments")
    torch.cuda.empty_cache()
    rec = t2.record()
    assert "skipped x1" in rec["note"]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_gpu_channels_last_bf16_conv(trial):
    t = trial("channels_last+bf16")
    net = Net().cuda()
    y = net(torch.randn(2, 3, 16, 16, device="cuda"))
    assert y.dtype == torch.bfloat16 and y.is_contiguous(memory_format=torch.channels_last)
    assert t.record()["applied"]


def test_batched_fetch_reads_a_tensor_datasets_batches_in_one_call(trial):
    from torch.utils.data import DataLoader, TensorDataset
    x = torch.arange(40, dtype=torch.float32)[:, None].repeat(1, 3)
    y = torch.arange(40)
    plain = [b for b in DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True,
                                   generator=torch.Generator().manual_seed(3), drop_last=True)]
    t = trial("batched_fetch")
    calls = []
    ds = TensorDataset(x, y)
    orig = TensorDataset.__getitem__
    TensorDataset.__getitem__ = lambda self, i: calls.append(i) or orig(self, i)
    try:
        got = [b for b in DataLoader(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(3),
                                     drop_last=True)]
        DataLoader(ds, batch_size=8, collate_fn=lambda b: b)     # its own collate: left
    finally:
        TensorDataset.__getitem__ = orig
    # the same rows in the same order, read with one call a batch
    assert len(calls) == 5 and all(len(i) == 8 for i in calls)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(plain, got))
    assert t.record() == {"switch": "batched_fetch", "applied": True,
                          "note": "DataLoader x1: each batch read in one call (a BatchSampler as its sampler), "
                                  "DataLoader left as it was (a collate_fn of its own)"}
    assert trial("batched_fetch").record()["note"] == "no DataLoader"


def test_compile_says_which_modules_it_left_out(trial):
    """A VAE's encoder and decoder, each called from the program: the compile reaches the larger
    alone (the first called, of two the same size), and the record says the other stayed eager,
    so that its gain reads as part of the fix."""
    torch._dynamo.reset()
    t = trial("compile", compile_backend="eager")
    enc, dec = Tiny(8).to(DEV), torch.nn.Linear(1, 8).to(DEV)
    for _ in range(2):
        dec(enc(torch.randn(2, 8, device=DEV)))
    rec = t.record()
    assert rec["note"] == ("torch.compile (backend eager) of module Tiny (81 params); the program's other "
                           "module Linear (16 params), not compiled")
    assert rec["left_out"] == "the program's other module Linear (16 params), not compiled"
    assert dec not in t.shared["outermost"].compiled
    torch._dynamo.reset()


def test_the_modules_left_out_are_said_after_the_program_dropped_them(trial):
    # the record is made at the run's end, when the script's modules may be gone
    import gc
    torch._dynamo.reset()
    t = trial("compile", compile_backend="eager")
    enc, dec = Tiny(8).to(DEV), torch.nn.Linear(1, 8).to(DEV)
    dec(enc(torch.randn(2, 8, device=DEV)))
    del enc, dec
    gc.collect()
    assert t.record()["left_out"] == "the program's other module Linear (16 params), not compiled"
    torch._dynamo.reset()


def test_switches_that_can_be_turned_off_while_the_program_runs(trial):
    """An alternating trial's turns (profkit.capture.alternate): each toggling switch off is the
    program as it was, on again is the switch; the others say they cannot."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    before = torch.get_float32_matmul_precision()
    t = trial("compile+bf16+tf32", compile_backend="eager")
    assert t.toggles and before == "highest"
    seen = []

    class Probe(Tiny):
        def forward(self, x):
            seen.append((torch.is_autocast_enabled(torch.device(DEV).type), torch.compiler.is_compiling()))
            return super().forward(x)
    m = Probe().to(DEV)
    m(torch.randn(4, 16, device=DEV))
    t.toggle(False)
    assert torch.get_float32_matmul_precision() == before
    m(torch.randn(4, 16, device=DEV))
    t.toggle(True)
    assert torch.get_float32_matmul_precision() == "high"
    m(torch.randn(4, 16, device=DEV))
    # on: autocast, and the compiled module (its forward runs only while Dynamo traces it, again
    # where a guard on the settings fails); off: neither, the module itself
    assert seen[:2] == [(True, True), (False, False)] and set(seen[2:]) <= {(True, True)}
    torch._dynamo.reset()
    n = trial("no_empty_cache")
    n.toggle(False)
    torch.cuda.empty_cache()   # the real one (nothing to free here): not counted
    n.toggle(True)
    torch.cuda.empty_cache()
    assert n.record()["note"] == "torch.cuda.empty_cache() skipped x1"
    for name in ("channels_last", "fp32", "channels_last+bf16", "workers"):
        assert not trial(name).toggles
