"""CPU tests: the float reference implementations, the torch baselines, the custom-op contract
(opcheck, gradcheck, torch.compile fullgraph) and the host-side checks.  Run everywhere."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

import kernels
from kernels import _library
from _kernel_refs import OPS, TOL, call, make_inputs, op_args, op_name, ref64, rel_err

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SHAPES = ((1, 64), (3, 1000), (2, 5120), (4, 7168), (1, 12345), (2, 65536))
OPS_GELU = [(op, "none") for op in OPS] + [("bias_gelu", "tanh")]


def _check(outs, refs, dtype, what, slack=1.0):
    for i, (o, r) in enumerate(zip(outs, refs)):
        assert o.dtype == dtype, f"{what}: output {i} has dtype {o.dtype}"
        assert o.shape == r.shape, f"{what}: output {i} has shape {tuple(o.shape)}"
        err = rel_err(o, r)
        tol = TOL[dtype] * slack
        assert err <= tol, f"{what}: output {i} relative error {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("op,approx", OPS_GELU)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_cpu_matches_float64_reference(op, approx, dtype, shape, backend):
    inp = make_inputs(op, *shape, dtype)
    outs = call(op, inp, backend, approx)
    # The eager baseline rounds intermediates (e.g. x * scale) to the input dtype: 3x slack for it.
    _check(outs, ref64(op, inp, approx), dtype, f"{op}/{backend}", slack=3.0 if backend == "torch" else 1.0)


@pytest.mark.parametrize("op,approx", OPS_GELU)
def test_cpu_cuda_backend_is_the_same_reference(op, approx):
    """On CPU both compiled backends dispatch to the one float reference."""
    inp = make_inputs(op, 3, 1000, torch.bfloat16)
    a = call(op, inp, "triton", approx)
    b = call(op, inp, "cuda", approx)
    _check(b, ref64(op, inp, approx), torch.bfloat16, f"{op}/cuda-on-cpu")
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_rel_err_catches_wrong_and_unwritten_outputs():
    ref = torch.randn(4, 1000, dtype=torch.float64)
    assert rel_err(ref.float(), ref) < TOL[torch.float32]
    assert rel_err(ref * 1.03, ref) > TOL[torch.bfloat16]
    poisoned = ref.clone()
    poisoned[2, 7] = float("nan")
    assert rel_err(poisoned, ref) == math.inf


@pytest.mark.parametrize("op,approx", OPS_GELU)
def test_nan_propagates_like_the_baseline(op, approx):
    inp = make_inputs(op, 4, 256, torch.float32)
    inp["x"][1, 17] = float("nan")
    inp["x"][2, 3] = float("inf")
    got = call(op, {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}, "triton", approx)
    base = call(op, {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}, "torch", approx)
    for g, b in zip(got, base):
        assert torch.equal(torch.isnan(g), torch.isnan(b))
        assert torch.equal(torch.isinf(g), torch.isinf(b))
    assert bool(torch.isnan(got[0][1]).any())


def test_inplace_updates_residual():
    inp = make_inputs("add_rmsnorm_", 3, 1000, torch.float32)
    res = inp["residual"].clone()
    out = kernels.add_rmsnorm_(inp["x"], res, inp["weight"], inp["eps"])
    ref_out, ref_h = ref64("add_rmsnorm", inp)
    assert rel_err(res, ref_h) < 1e-6 and rel_err(out, ref_out) < 1e-5
    assert not torch.equal(res, inp["residual"])


@pytest.mark.parametrize("op", OPS)
def test_empty_tensors_give_empty_outputs(op):
    inp = make_inputs(op, 0, 64, torch.float32)
    for backend in ("triton", "cuda", "torch"):
        for o in call(op, inp, backend):
            assert o.shape == (0, 64)


def test_non_contiguous_inputs_are_accepted():
    x = torch.randn(7, 128)[:, ::2]  # (7, 64) with stride 2
    assert not x.is_contiguous()
    inp = dict(x=x, residual=torch.randn(7, 64), weight=torch.randn(64), eps=1e-6)
    outs = call("add_rmsnorm", inp, "triton")
    _check(outs, ref64("add_rmsnorm", inp), torch.float32, "non-contiguous")


def test_host_side_checks_raise_clear_errors():
    x, w = torch.randn(4, 64), torch.randn(64)
    with pytest.raises(TypeError, match="dtype"):
        kernels.add_rmsnorm(x.int(), x.int(), w.int())
    with pytest.raises(TypeError, match="residual has dtype"):
        kernels.add_rmsnorm(x, x.half(), w)
    with pytest.raises(ValueError, match="residual has shape"):
        kernels.add_rmsnorm(x, torch.randn(4, 32), w)
    with pytest.raises(ValueError, match="weight must have shape"):
        kernels.add_rmsnorm(x, x, torch.randn(32))
    with pytest.raises(ValueError, match="bias must have shape"):
        kernels.add_layernorm(x, x, w, torch.randn(3))
    with pytest.raises(ValueError, match="bias must have shape"):
        kernels.bias_gelu(x, torch.randn(4, 64))
    with pytest.raises(ValueError, match="approximate"):
        kernels.bias_gelu(x, w, approximate="sigmoid")
    with pytest.raises(ValueError, match="backend"):
        kernels.softmax(x, backend="cudnn")
    with pytest.raises(ValueError, match="contiguous"):
        kernels.add_rmsnorm_(x, torch.randn(64, 4).t(), w)
    with pytest.raises(TypeError, match="torch.Tensor"):
        kernels.softmax([1.0, 2.0])


def test_cuda_backend_without_gpu_raises_build_error():
    from kernels import _build

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(kernels.KernelBuildError, match="CUDA"):
        _build.ensure_loaded()


def test_import_without_torch_fails_only_on_use():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import kernels\n"
        "try:\n    kernels.add_rmsnorm\nexcept ImportError as e:\n    assert 'pip install' in str(e), e\n"
        "    print('ok')\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


# ---------------------------------------------------------------------------------------------
# custom-op contract
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", _library.COMPILED_BACKENDS)
@pytest.mark.parametrize("op,approx", OPS_GELU)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck_cpu(op, approx, backend, requires_grad):
    if requires_grad and op == "add_rmsnorm_":
        pytest.skip("the in-place variant is inference-only (no autograd)")
    inp = make_inputs(op, 3, 40, torch.float32)
    if requires_grad:
        for k, v in inp.items():
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                v.requires_grad_(True)
    fn = getattr(torch.ops.profkit_kernels, f"{op_name(op)}_{backend}")
    torch.library.opcheck(fn, op_args(op, inp, approx))


@pytest.mark.parametrize("backend", _library.COMPILED_BACKENDS)
@pytest.mark.parametrize("op,approx", [o for o in OPS_GELU if o[0] != "add_rmsnorm_"])
def test_gradcheck_float64(op, approx, backend):
    inp = make_inputs(op, 3, 17, torch.float64)
    for v in inp.values():
        if isinstance(v, torch.Tensor):
            v.requires_grad_(True)
    fn = getattr(torch.ops.profkit_kernels, f"{op_name(op)}_{backend}")
    assert torch.autograd.gradcheck(lambda *a: fn(*a), op_args(op, inp, approx), eps=1e-6, atol=1e-5)


def test_backward_matches_baseline_float32():
    inp = make_inputs("add_layernorm", 5, 96, torch.float32)
    leaves = [inp[k].clone().requires_grad_(True) for k in ("x", "residual", "weight", "bias")]
    leaves2 = [t.detach().clone().requires_grad_(True) for t in leaves]
    out, h = kernels.add_layernorm(*leaves, 1e-5)
    ((out * torch.linspace(-1, 1, 96)).sum() + (h**2).sum()).backward()
    out2, h2 = kernels.add_layernorm(*leaves2, 1e-5, backend="torch")
    ((out2 * torch.linspace(-1, 1, 96)).sum() + (h2**2).sum()).backward()
    for a, b in zip(leaves, leaves2):
        assert rel_err(a.grad, b.grad) < 1e-5


def _inductor_cpu_works() -> str | None:
    try:
        torch.compile(lambda t: t * 2 + 1, fullgraph=True)(torch.randn(8))
        return None
    except Exception as exc:  # no C++ compiler, inductor unavailable, ...
        return f"inductor on CPU unavailable here: {type(exc).__name__}: {str(exc)[:200]}"


@pytest.mark.parametrize("backend", _library.COMPILED_BACKENDS)
def test_torch_compile_fullgraph_cpu(backend):
    reason = _inductor_cpu_works()
    if reason:
        pytest.skip(reason)
    torch._dynamo.reset()

    def block(x, r, w, b, bias):
        out, h = kernels.add_rmsnorm(x, r, w, 1e-6, backend=backend)
        out2, h2 = kernels.add_layernorm(out, h, w, b, 1e-5, backend=backend)
        g = kernels.bias_gelu(out2, bias, "tanh", backend=backend)
        y = kernels.softmax(g, 0.5, backend=backend)
        h3 = h2.clone()
        z = kernels.add_rmsnorm_(y, h3, w, 1e-6, backend=backend)
        return z, h3

    args = [torch.randn(6, 64), torch.randn(6, 64), torch.randn(64), torch.randn(64), torch.randn(64)]
    compiled = torch.compile(block, fullgraph=True)
    got = compiled(*args)
    want = block(*args)
    for g, w in zip(got, want):
        assert rel_err(g, w) < 1e-5
