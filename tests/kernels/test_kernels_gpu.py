"""GPU tests: both compiled backends against float64 references on the device, at odd, long and
LLM shapes; opcheck and torch.compile on CUDA.  Skipped cleanly without a CUDA device."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels import _library
from _kernel_refs import OPS, TOL, call, make_inputs, op_args, op_name, ref64, rel_err

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

BACKENDS = ("triton", "cuda")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SMALL = ((1, 4096), (3, 1000), (7, 5120), (5, 7168), (2, 12345), (4, 65536), (33, 2048), (1, 8))
BIG = ((65536, 2048), (16384, 4096), (4096, 8192), (64, 8192))
OPS_GELU = [(op, "none") for op in OPS] + [("bias_gelu", "tanh")]


@pytest.fixture(scope="module", autouse=True)
def built():
    from kernels import _build

    _build.ensure_loaded()


def _poison_allocator(inp, n_outputs):
    """Fill blocks of the outputs' size with NaN and free them: the caching allocator hands the same
    blocks to the op's outputs, so an element the kernel fails to write stays NaN."""
    x = inp["x"]
    junk = [torch.full_like(x, float("nan")) for _ in range(n_outputs + 1)]
    del junk


def _run(op, approx, backend, rows, hidden, dtype):
    inp = make_inputs(op, rows, hidden, dtype, device="cuda")
    refs = ref64(op, inp, approx)
    _poison_allocator(inp, len(refs))
    outs = call(op, inp, backend, approx)
    torch.cuda.synchronize()
    for i, (o, r) in enumerate(zip(outs, refs)):
        assert o.dtype == dtype and o.shape == r.shape and o.is_cuda
        err = rel_err(o, r)
        assert err <= TOL[dtype], f"{op}/{backend} {rows}x{hidden} {dtype}: output {i} rel err {err:.3g}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op,approx", OPS_GELU)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SMALL, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpu_matches_float64(op, approx, backend, dtype, shape):
    _run(op, approx, backend, *shape, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op,approx", OPS_GELU)
@pytest.mark.parametrize("shape", BIG, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpu_llm_shapes_bf16(op, approx, backend, shape):
    _run(op, approx, backend, *shape, torch.bfloat16)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_largest_llm_shape(backend):
    _run("add_rmsnorm", "none", backend, 65536, 8192, torch.bfloat16)


@pytest.mark.parametrize("backend", BACKENDS)
def test_triton_launchers_write_every_element(backend):
    """Exact poisoning through the launchers' out= arguments (Triton) and through the allocator (CUDA)."""
    from kernels import triton_kernels as tk

    inp = make_inputs("add_rmsnorm", 37, 5120, torch.bfloat16, device="cuda")
    out = torch.full_like(inp["x"], float("nan"))
    h = torch.full_like(inp["x"], float("nan"))
    tk.add_rmsnorm(inp["x"], inp["residual"], inp["weight"], inp["eps"], out=out, residual_out=h)
    refs = ref64("add_rmsnorm", inp)
    assert rel_err(out, refs[0]) <= TOL[torch.bfloat16] and rel_err(h, refs[1]) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["add_rmsnorm", "add_layernorm", "bias_gelu", "softmax"])
def test_misaligned_inputs_take_the_scalar_path(op, backend):
    inp = make_inputs(op, 5, 4096, torch.bfloat16, device="cuda")
    buf = torch.empty(inp["x"].numel() + 1, dtype=torch.bfloat16, device="cuda")
    x = buf[1:].view_as(inp["x"])  # contiguous, but 2 bytes off 16-byte alignment
    x.copy_(inp["x"])
    assert x.is_contiguous() and x.data_ptr() % 16 != 0
    inp["x"] = x
    outs = call(op, inp, backend)
    for o, r in zip(outs, ref64(op, inp)):
        assert rel_err(o, r) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("backend", BACKENDS)
def test_inplace_residual_on_gpu(backend):
    inp = make_inputs("add_rmsnorm_", 64, 4096, torch.bfloat16, device="cuda")
    res = inp["residual"].clone()
    out = kernels.add_rmsnorm_(inp["x"], res, inp["weight"], inp["eps"], backend=backend)
    ref_out, ref_h = ref64("add_rmsnorm", inp)
    assert rel_err(out, ref_out) <= TOL[torch.bfloat16] and rel_err(res, ref_h) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op,approx", OPS_GELU)
def test_nan_propagates_like_eager_gpu(op, approx, backend):
    inp = make_inputs(op, 4, 4096, torch.float32, device="cuda")
    inp["x"][1, 17] = float("nan")
    clone = lambda: {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}  # noqa: E731
    got, base = call(op, clone(), backend, approx), call(op, clone(), "torch", approx)
    for g, b in zip(got, base):
        assert torch.equal(g.isnan(), b.isnan())


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_and_device_checks_gpu(backend):
    x = torch.empty(0, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    out, h = kernels.add_rmsnorm(x, x, w, backend=backend)
    assert out.shape == (0, 4096) and h.shape == (0, 4096)
    with pytest.raises(ValueError, match="device"):
        kernels.add_rmsnorm(torch.randn(2, 4096, device="cuda"), torch.randn(2, 4096), torch.randn(4096),
                            backend=backend)
    with pytest.raises(TypeError, match="float64"):
        kernels.softmax(torch.randn(2, 8, device="cuda", dtype=torch.float64), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op,approx", OPS_GELU)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck_cuda(op, approx, backend, requires_grad):
    if requires_grad and op == "add_rmsnorm_":
        pytest.skip("the in-place variant is inference-only (no autograd)")
    inp = make_inputs(op, 3, 256, torch.float32, device="cuda")
    if requires_grad:
        for v in inp.values():
            if isinstance(v, torch.Tensor):
                v.requires_grad_(True)
    fn = getattr(torch.ops.profkit_kernels, f"{op_name(op)}_{backend}")
    torch.library.opcheck(fn, op_args(op, inp, approx))


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_matches_eager_gpu(backend):
    inp = make_inputs("add_rmsnorm", 8, 4096, torch.float32, device="cuda")
    a = [inp[k].clone().requires_grad_(True) for k in ("x", "residual", "weight")]
    b = [t.detach().clone().requires_grad_(True) for t in a]
    g = torch.randn(8, 4096, device="cuda")
    out, h = kernels.add_rmsnorm(*a, 1e-6, backend=backend)
    ((out * g).sum() + h.sum()).backward()
    out2, h2 = kernels.add_rmsnorm(*b, 1e-6, backend="torch")
    ((out2 * g).sum() + h2.sum()).backward()
    for p, q in zip(a, b):
        assert rel_err(p.grad, q.grad) < 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_compile_fullgraph_cuda(backend):
    torch._dynamo.reset()

    def block(x, r, w, b, bias):
        out, h = kernels.add_rmsnorm(x, r, w, 1e-6, backend=backend)
        out2, h2 = kernels.add_layernorm(out, h, w, b, 1e-5, backend=backend)
        y = kernels.softmax(kernels.bias_gelu(out2, bias, "none", backend=backend), 0.5, backend=backend)
        return y, h2

    args = [torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    args += [torch.randn(1024, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    want = block(*args)
    got = torch.compile(block, fullgraph=True)(*args)
    for g, w in zip(got, want):
        assert rel_err(g, w) < 1e-3


@pytest.mark.parametrize("variant", (0, 1, 2, 3))
@pytest.mark.parametrize("op,approx", OPS_GELU)
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("shape", ((1, 4096), (16, 4096), (7, 5120), (300, 2048), (64, 8192)),
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpu_every_launch_variant(op, approx, variant, dtype, shape):
    """Every CUDA kernel body and launch configuration a benchmark can select, not only the defaults."""
    from kernels import _build

    name = "add_rmsnorm" if op == "add_rmsnorm_" else op
    old = _build.set_launch_variant(name, variant)
    try:
        _run(op, approx, "cuda", *shape, dtype)
    finally:
        _build.set_launch_variant(name, old)


@pytest.mark.parametrize("op,shape", [("softmax", (16, 4096)), ("add_rmsnorm_", (1, 4096)),
                                      ("bias_gelu", (64, 8192)), ("add_layernorm", (4096, 4096))],
                         ids=lambda v: v if isinstance(v, str) else f"{v[0]}x{v[1]}")
def test_auto_runs_the_gpu_faster_backend_inside_a_cuda_graph(op, shape, monkeypatch):
    """Eager: the extension, with Triton prepared on copies; captured: Triton, and the replay is right."""
    from kernels import ops

    monkeypatch.setattr(ops, "_CHOICE", {})
    used, real = [], ops._op
    monkeypatch.setattr(ops, "_op", lambda name, be: used.append(be) or real(name, be))
    inp = make_inputs(op, *shape, torch.bfloat16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up before capture, as torch.cuda.graph's documentation does
        call(op, inp, "auto")
    torch.cuda.current_stream().wait_stream(side)
    assert used == ["triton", "cuda"]
    used.clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = call(op, inp, "auto")
    assert used == ["triton"]
    for o in outs:
        o.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for o, r in zip(outs, ref64(op, inp)):
        assert rel_err(o, r) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("op,approx", OPS_GELU)
def test_triton_repeat_launches_match_float64(op, approx):
    """The first call of a specialisation goes through Triton's JIT, later ones through the compiled
    kernel's own launcher: both right, for fresh inputs each time and interleaved hidden sizes."""
    from kernels import triton_kernels as tk

    tk._FAST.clear()
    for rows, hidden in ((5, 4096), (5, 4104), (5, 4096), (300, 4096), (5, 4104), (300, 4096), (5, 4096)):
        _run(op, approx, "triton", rows, hidden, torch.bfloat16)
    assert tk._FAST and all(tk._FAST.values())  # every specialisation took the compiled-kernel path
