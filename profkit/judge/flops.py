"""Analytic FLOP and byte counts for aten:: ops, from the shapes that ``emit_nvtx`` records.

Pure Python (no torch). Two entry points:

* :func:`parse_aten_range` reads the NVTX text written by
  ``torch.autograd.profiler.emit_nvtx(record_shapes=True)`` (torch's ``getNvtxStr``)::

      aten::addmm, seq = 12, op_id = 3, sizes = [[4096], [8, 1024], [1024, 4096], [], []], input_op_ids = [(1,0), (2,0)]

  ``seq`` appears only when autograd records the op, ``op_id``/``input_op_ids`` only in newer
  torch; ``[]`` stands for a scalar or a non-tensor argument (ints, int lists, None), so the
  positions of ``sizes`` follow the op's schema.
* :func:`estimate` turns ``(op, sizes)`` into an :class:`OpCost` (FLOPs, bytes, a ``kind`` and
  the formula used), or ``None`` when profkit has no model for the op: it never guesses.

Conventions: a multiply-add is 2 FLOPs; bytes are the ideal DRAM traffic (each input read once,
each output written once) at ``elem_bytes`` per element (index tensors: 8 bytes, int64).
Outputs follow broadcasting of the tensor inputs.

Wrappers and double counting: emit_nvtx nests ranges, e.g. ``aten::linear`` ->
``aten::matmul`` -> ``aten::mm``, or ``aten::rms_norm`` -> ``aten::_fused_rms_norm``. The work
belongs to the innermost range that has a model: attribute a kernel to the innermost aten range
around its launch for which :func:`estimate` is not None (:func:`innermost_modeled` does this),
and never add a wrapper's estimate to its callee's. :func:`aten_is_wrapper` names the ops that
normally only dispatch to another modeled op (use the wrapper's own estimate only when no inner
range is present, e.g. a backend that fuses the whole op into one kernel).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from profkit.read.aten_record import balanced, flatten_sizes, literal_sizes

Shape = list[int]
INDEX_BYTES = 8  # int64 indices


# --- parsing ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AtenCall:
    """One aten:: NVTX range: the op, its input shapes (tensor lists flattened), seq and op_id."""
    op: str
    sizes: list[Shape]
    seq: Optional[int] = None
    op_id: Optional[int] = None
    raw_sizes: list = field(default_factory=list, compare=False, repr=False)


_OP_RE = re.compile(r"^\s*(?P<op>[A-Za-z_][\w]*::[\w.]+)\s*(?:,|$)")
_FIELD_RE = re.compile(r",\s*(?P<key>seq|op_id)\s*=\s*(?P<value>-?\d+)")


def parse_aten_range(text: str) -> Optional[AtenCall]:
    """Parse emit_nvtx text (``"aten::mm, seq = 4, op_id = 7, sizes = [[8, 16], [16, 4]]"``).

    Returns None for text that is not an op range (user ranges such as ``"forward"``).
    """
    if not isinstance(text, str):
        return None
    m = _OP_RE.match(text)
    if not m:
        return None
    op = m.group("op")
    head = text.split(", sizes = ", 1)[0]
    fields = {fm.group("key"): int(fm.group("value")) for fm in _FIELD_RE.finditer(head)}
    raw: list = []
    at = text.find("sizes = [")
    if at >= 0:
        block = balanced(text, at + len("sizes = "))
        raw = literal_sizes(block) if block is not None else None
        if raw is None:
            return None
    seq = fields.get("seq")
    return AtenCall(op=op, sizes=flatten_sizes(raw), seq=seq if seq is None or seq >= 0 else None,
                    op_id=fields.get("op_id"), raw_sizes=raw)


# --- results -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class OpCost:
    flops: float
    bytes: float
    kind: str      # gemm, conv, attention, elementwise, reduction, norm, softmax, gather, copy, ...
    formula: str   # the formula with the numbers used, for the evidence column

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else math.inf


def numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def broadcast_shapes(*shapes: Sequence[int]) -> Optional[Shape]:
    """NumPy broadcasting of ``shapes``; None when they do not broadcast."""
    ndim = max((len(s) for s in shapes), default=0)
    out: Shape = []
    for i in range(ndim):
        dims = {s[len(s) - ndim + i] for s in shapes if len(s) - ndim + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            return None
        out.append(dims.pop() if dims else 1)
    return out


def normalize_op(op: str) -> str:
    """``"aten::add_.Tensor"`` -> ``"add"``: namespace, overload and in-place ``_`` dropped."""
    name = op.split("::", 1)[-1]
    name = name.split(".", 1)[0]
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]  # in-place variant: same work
    return name


def _tensors(sizes: Sequence[Shape]) -> list[Shape]:
    return [s for s in sizes if s]


def _fmt(x: float) -> str:
    return f"{x:.4g}"


# --- GEMM family ------------------------------------------------------------------------------------
def _gemm_cost(batch: int, m: int, k: int, n: int, in_elems: int, out_elems: int, eb: int,
               extra_flops: float, what: str) -> OpCost:
    flops = 2.0 * batch * m * k * n + extra_flops
    byt = float(in_elems + out_elems) * eb
    formula = f"{what}: 2*{batch}*{m}*{k}*{n}" if batch != 1 else f"{what}: 2*{m}*{k}*{n}"
    if extra_flops:
        formula += f" + {_fmt(extra_flops)} (bias)"
    formula += f" FLOP; bytes = ({in_elems} in + {out_elems} out) * {eb}"
    return OpCost(flops, byt, "gemm", formula)


def cost_mm(sizes: Sequence[Shape], eb: int) -> Optional[OpCost]:
    """mm(A[M,K], B[K,N]): 2*M*K*N FLOPs; bytes = (MK + KN + MN) * elem_bytes."""
    t = sizes[:2]
    if len(t) < 2 or len(t[0]) != 2 or len(t[1]) != 2:
        return None
    (m, k), (_, n) = t[0], t[1]
    return _gemm_cost(1, m, k, n, m * k + k * n, m * n, eb, 0, "mm")


def cost_addmm(sizes: Sequence[Shape], eb: int) -> Optional[OpCost]:
    """addmm(bias, A[M,K], B[K,N]): 2*M*K*N + M*N FLOPs; bytes add the bias read."""
    if len(sizes) < 3 or len(sizes[1]) != 2 or len(sizes[2]) != 2:
        return None
    (m, k), (_, n) = sizes[1], sizes[2]
    bias = numel(sizes[0]) if sizes[0] else 0
    return _gemm_cost(1, m, k, n, bias + m * k + k * n, m * n, eb, m * n, "addmm")


def cost_bmm(sizes: Sequence[Shape], eb: int) -> Optional[OpCost]:
    """bmm(A[B,M,K], B[B,K,N]): 2*B*M*K*N FLOPs; bytes = B*(MK + KN + MN) * elem_bytes."""
    if len(sizes) < 2 or len(sizes[0]) != 3 or len(sizes[1]) != 3:
        return None
    (b, m, k), (_, _, n) = sizes[0], sizes[1]
    return _gemm_cost(b, m, k, n, b * (m * k + k * n), b * m * n, eb, 0, "bmm")


def cost_baddbmm(sizes: Sequence[Shape], eb: int) -> Optional[OpCost]:
    """baddbmm(C, A[B,M,K], B[B,K,N]): 2*B*M*K*N + B*M*N FLOPs."""
    if len(sizes) < 3 or len(sizes[1]) != 3 or len(sizes[2]) != 3:
        return None
    (b, m, k), (_, _, n) = sizes[1], sizes[2]
    c = numel(sizes[0]) if sizes[0] else 0
    return _gemm_cost(b, m, k, n, c + b * (m * k + k * n), b * m * n, eb, b * m * n, "baddbmm")


def cost_matmul(sizes: Sequence[Shape], eb: int) -> Optional[OpCost]:
    """matmul(A[..., M, K], B[..., K, N]) with torch's 1-D rules: 2*batch*M*K*N FLOPs,
    batch = broadcast of the leading dims."""
    if len(sizes) < 2 or not sizes[0] or not sizes[1]:
        return None
    a, b = list(sizes[0]), list(sizes[1])
    a2 = [1, a[0]] if len(a) == 1 else a
    b2 = [b[0], 1] if len(b) == 1 else b
    m, k = a2[-2], a2[-1]
    n = b2[-1]
    if b2[-2] != k:
        return None
    batch_shape = broadcast_shapes(a2[:-2], b2[:-2])
    if batch_shape is None:
        return None
    batch = numel(batch_shape)
    return _gemm_cost(batch, m, k, n, numel(a) + numel(b), batch * m * n, eb, 0, "matmul")


def cost_linear(sizes: Sequence[Shape], eb: int) -> Optional[OpCost]:
    """linear(x[..., K], W[N, K], b[N]?): 2*M*K*N (+ M*N with bias), M = prod(x.shape[:-1])."""
    if len(sizes) < 2 or not sizes[0] or len(sizes[1]) != 2:
        return None
    x, w = sizes[0], sizes[1]
    k = x[-1]
    n = w[0]
    if w[1] != k:
        return None
    m = numel(x[:-1])
    bias = numel(sizes[2]) if len(sizes) > 2 and sizes[2] else 0
    return _gemm_cost(1, m, k, n, numel(x) + numel(w) + bias, m * n, eb, m * n if bias else 0,
                      "linear")


# --- convolution ------------------------------------------------------------------------------------
def cost_conv(sizes: Sequence[Shape], eb: int) -> Optional[OpCost]:
    """conv(x[N, Cin, *S], w[Cout, Cin/groups, *K], bias?): 2*N*Cout*prod(S_out)*(Cin/groups)*prod(K).

    Stride, padding and dilation are int lists, which emit_nvtx records as ``[]``: the output
    is assumed to keep the input's spatial size (stride 1, 'same' padding), and the formula
    says so. Bytes = x + w + bias + output.
    """
    if len(sizes) < 2 or len(sizes[0]) < 3 or len(sizes[1]) != len(sizes[0]):
        return None
    x, w = sizes[0], sizes[1]
    n, spatial = x[0], x[2:]
    cout, cin_g, kernel = w[0], w[1], w[2:]
    out_elems = n * cout * numel(spatial)
    bias = numel(sizes[2]) if len(sizes) > 2 and sizes[2] and len(sizes[2]) == 1 \
        and sizes[2][0] == cout else 0
    flops = 2.0 * out_elems * cin_g * numel(kernel) + (out_elems if bias else 0)
    byt = float(numel(x) + numel(w) + bias + out_elems) * eb
    formula = (f"conv{len(spatial)}d: 2*{n}*{cout}*{'*'.join(map(str, spatial))}*{cin_g}*"
               f"{'*'.join(map(str, kernel))} FLOP, output spatial size assumed = input's "
               f"(stride/padding not in the shapes); bytes = (x + w + bias + out) * {eb}")
    return OpCost(flops, byt, "conv", formula)


# --- attention --------------------------------------------------------------------------------------
_BLHD_ATTENTION = {"_flash_attention_forward", "_efficient_attention_forward"}


def cost_attention(sizes: Sequence[Shape], eb: int, causal: bool = False,
                   layout: str = "BHLD") -> Optional[OpCost]:
    """SDPA: 2*B*H*Lq*Lk*D (Q K^T) + 2*B*H*Lq*Lk*Dv (P V) = 4*B*H*Lq*Lk*D when Dv = D;
    causal masking halves it. Bytes = q + k + v + out (the ideal, fused kernel)."""
    t = sizes[:3]
    if len(t) < 3 or any(len(s) != 4 for s in t):
        return None
    q, k, v = t
    if layout == "BLHD":
        b, lq, h, d = q
        lk, dv = k[1], v[3]
    else:
        b, h, lq, d = q
        lk, dv = k[2], v[3]
    out = b * h * lq * dv
    flops = 2.0 * b * h * lq * lk * d + 2.0 * b * h * lq * lk * dv
    if causal:
        flops /= 2
    byt = float(numel(q) + numel(k) + numel(v) + out) * eb
    formula = (f"attention: 2*{b}*{h}*{lq}*{lk}*({d}+{dv}) FLOP"
               + (" / 2 (causal)" if causal else "")
               + f"; bytes = (q + k + v + out) * {eb}")
    return OpCost(flops, byt, "attention", formula)


def cost_attention_backward(sizes: Sequence[Shape], eb: int, causal: bool = False,
                            layout: str = "BHLD") -> Optional[OpCost]:
    """SDPA backward (grad_out, q, k, v, out, ...): five matmuls over the score matrix (S
    recomputed, dV, dP, dQ, dK) = 2.5x the forward's FLOPs; causal halves them. Bytes = dO + q +
    k + v + out read, dq + dk + dv written (the ideal, fused kernel)."""
    t = [s for s in sizes[:5]]
    if len(t) < 5 or any(len(s) != 4 for s in t):
        return None
    do, q, k, v, o = t
    fwd = cost_attention([q, k, v], eb, causal=causal, layout=layout)
    if fwd is None:
        return None
    flops = 2.5 * fwd.flops
    byt = float(numel(do) + numel(q) + numel(k) + numel(v) + numel(o)
                + numel(q) + numel(k) + numel(v)) * eb
    return OpCost(flops, byt, "attention",
                  f"attention backward: 2.5 x ({fwd.formula.split(';')[0].split(': ', 1)[1]}) FLOP; "
                  f"bytes = (dO + q + k + v + out read, dq + dk + dv written) * {eb}")


# --- elementwise -----------------------------------------------------------------------------------
# FLOPs per output element where 1 is too few (approximations of the usual CUDA code paths).
ELEMENTWISE_FLOPS: dict[str, int] = {
    "gelu": 8,      # 0.5*x*(1+erf(x/sqrt2)) or the tanh form: ~8 arithmetic ops
    "silu": 4,      # x / (1 + exp(-x))
    "sigmoid": 4,   # 1 / (1 + exp(-x))
    "tanh": 4,
    "mish": 8,
    "softplus": 4,
    "elu": 3,
    "erf": 4,
    "lerp": 3,
    "addcmul": 3,
    "addcdiv": 3,
    "silu_backward": 6,
    "gelu_backward": 10,
    "sigmoid_backward": 2,
    "tanh_backward": 2,
}
ELEMENTWISE_OPS = {
    "add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "neg", "abs", "relu",
    "relu6", "gelu", "silu", "sigmoid", "tanh", "exp", "exp2", "expm1", "log", "log2", "log1p",
    "sqrt", "rsqrt", "reciprocal", "pow", "square", "sin", "cos", "clamp", "clamp_min",
    "clamp_max", "hardtanh", "leaky_relu", "elu", "erf", "mish", "softplus", "hardswish",
    "hardsigmoid", "threshold", "maximum", "minimum", "where", "masked_fill", "lerp", "addcmul",
    "addcdiv", "sign", "floor", "ceil", "round", "trunc", "fmod", "remainder", "eq", "ne", "lt",
    "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "bitwise_and", "bitwise_or",
    "dropout", "native_dropout", "sgn", "fill", "zero", "copysign", "nan_to_num",
    # activation backward: (grad, input or output) read, grad_input written
    "silu_backward", "gelu_backward", "sigmoid_backward", "tanh_backward", "threshold_backward",
    "hardswish_backward", "elu_backward", "leaky_relu_backward", "hardtanh_backward",
}
_ZERO_FLOP = {"fill", "zero"}


# Arguments of the functional overload as emit_nvtx lists them (tensors and scalars alike). A
# further trailing tensor is the ``out=`` argument: written, never read.
ELEMENTWISE_ARITY: dict[str, int] = {
    "add": 3, "sub": 3, "rsub": 3, "mul": 2, "div": 2, "true_divide": 2, "maximum": 2,
    "minimum": 2, "pow": 2, "fmod": 2, "remainder": 2, "eq": 2, "ne": 2, "lt": 2, "le": 2,
    "gt": 2, "ge": 2, "logical_and": 2, "logical_or": 2, "bitwise_and": 2, "bitwise_or": 2,
    "copysign": 2, "floor_divide": 2, "where": 3, "lerp": 3, "addcmul": 4, "addcdiv": 4,
    "neg": 1, "abs": 1, "relu": 1, "silu": 1, "sigmoid": 1, "tanh": 1, "exp": 1, "exp2": 1,
    "expm1": 1, "log": 1, "log2": 1, "log1p": 1, "sqrt": 1, "rsqrt": 1, "reciprocal": 1,
    "square": 1, "sin": 1, "cos": 1, "erf": 1, "sign": 1, "sgn": 1, "floor": 1, "ceil": 1,
    "trunc": 1, "logical_not": 1, "gelu": 2, "clamp": 3, "clamp_min": 2, "clamp_max": 2,
}


def split_out(op: str, sizes: Sequence[Shape], overload: str = "") -> tuple[list[Shape], Optional[Shape]]:
    """(tensor inputs read, the ``out=`` tensor or None) of an elementwise call.

    ``out=`` shows as one tensor entry past the functional overload's arguments (or as an
    ``.out`` overload name, where the text keeps it)."""
    entries = list(sizes)
    arity = ELEMENTWISE_ARITY.get(op)
    if entries and entries[-1] and (overload.startswith("out")
                                    or (arity is not None and len(entries) == arity + 1)):
        return _tensors(entries[:-1]), list(entries[-1])
    return _tensors(entries), None


def cost_elementwise(op: str, sizes: Sequence[Shape], eb: int, overload: str = "",
                     out_eb: Optional[int] = None) -> Optional[OpCost]:
    """Elementwise: ``f`` FLOPs per output element (1, or :data:`ELEMENTWISE_FLOPS`); output =
    broadcast of the tensor inputs; bytes = (tensor inputs read + output written) * elem_bytes.
    An ``out=`` tensor is written, not read; ``out_eb``: bytes per output element when the
    output's type differs (comparisons write bool)."""
    ins_t, out_t = split_out(op, sizes, overload)
    if not ins_t and out_t is None:
        return None
    if op in _ZERO_FLOP:
        # fill_/zero_ write their only tensor
        target = out_t or (ins_t[0] if ins_t else None)
        out = numel(target)
        return OpCost(0.0, float(out) * eb, "fill", f"{op}: 0 FLOP; bytes = {out} out * {eb}")
    out_shape = broadcast_shapes(*ins_t) if ins_t else out_t
    if out_shape is None:
        return None
    out = numel(out_t) if out_t is not None else numel(out_shape)
    oeb = eb if out_eb is None else out_eb
    per = ELEMENTWISE_FLOPS.get(op, 1)
    ins = sum(numel(s) for s in ins_t)
    note = f" (~{per} FLOP/element for {op})" if per != 1 else ""
    where = " (out= written, not read)" if out_t is not None else ""
    wbytes = f"{out} out * {oeb}" if oeb != eb else f"{out} out) * {eb}"
    formula = (f"{op}: {per}*{out} FLOP{note}; bytes = ({ins} in + {wbytes}{where}"
               if oeb == eb else
               f"{op}: {per}*{out} FLOP{note}; bytes = {ins} in * {eb} + {wbytes}{where}")
    return OpCost(float(per) * out, float(ins * eb + out * oeb), "elementwise", formula)


# --- reductions, norms, softmax -------------------------------------------------------------------
REDUCTION_OPS = {"sum": 1, "mean": 1, "amax": 1, "amin": 1, "max": 1, "min": 1, "prod": 1,
                 "norm": 2, "linalg_vector_norm": 2, "var": 3, "std": 3, "logsumexp": 3,
                 "argmax": 1, "argmin": 1, "any": 1, "all": 1}


def reduced_elems(shape: Sequence[int], dims: Optional[Sequence[int]]) -> int:
    """Elements left after reducing ``shape`` over ``dims`` (None or empty: all of them)."""
    if not dims:
        return 1
    nd = len(shape)
    gone = {d % nd for d in dims if -nd <= d < nd} if nd else set()
    return numel([s for i, s in enumerate(shape) if i not in gone])


def cost_reduction(op: str, sizes: Sequence[Shape], eb: int,
                   out_elems: Optional[int] = None, out_eb: Optional[int] = None) -> Optional[OpCost]:
    """Reduction over some dims: ``f`` FLOPs per input element; bytes = input read (the reduced
    output is assumed small: the dims are int lists that emit_nvtx does not record) plus, when
    the output size is known (profkit's recorder records dims or outputs), the output written."""
    if not sizes or not sizes[0]:
        return None
    n = numel(sizes[0])
    per = REDUCTION_OPS[op]
    if out_elems is not None:
        oeb = out_eb or eb
        return OpCost(float(per) * n, float(n * eb + out_elems * oeb), "reduction",
                      f"{op}: {per}*{n} FLOP; bytes = {n} in * {eb} + {out_elems} out * {oeb} "
                      "(output size recorded)")
    return OpCost(float(per) * n, float(n) * eb, "reduction",
                  f"{op}: {per}*{n} FLOP; bytes = {n} in * {eb} (output assumed small)")


def cost_layer_norm(sizes: Sequence[Shape], eb: int) -> Optional[OpCost]:
    """layer_norm(x, normalized_shape, w?, b?): ~8 FLOPs/element (mean, centre, square-sum,
    scale, affine); bytes = x + w + b + out."""
    if not sizes or not sizes[0]:
        return None
    n = numel(sizes[0])
    params = sum(numel(s) for s in sizes[1:4] if s)
    return OpCost(8.0 * n, float(2 * n + params) * eb, "norm",
                  f"layer_norm: 8*{n} FLOP; bytes = ({n} in + {params} params + {n} out) * {eb}")


def cost_rms_norm(sizes: Sequence[Shape], eb: int) -> Optional[OpCost]:
    """rms_norm(x, normalized_shape, w?, eps): ~4 FLOPs/element (square-sum, scale, weight);
    bytes = x + w + out."""
    if not sizes or not sizes[0]:
        return None
    n = numel(sizes[0])
    params = sum(numel(s) for s in sizes[1:3] if s)
    return OpCost(4.0 * n, float(2 * n + params) * eb, "norm",
                  f"rms_norm: 4*{n} FLOP; bytes = ({n} in + {params} params + {n} out) * {eb}")


# PyTorch's softmax kernels (aten/src/ATen/native/cuda/SoftMax.cu) keep a row on chip only when
# it fits: a warp per row up to 1024 elements, else the row in shared memory while it fits the
# default 48 KiB per block. A longer row is read from memory again for the pass that writes the
# result (forward: once for max and sum, once to write; backward: the incoming gradient twice).
# ncu on the H200, [4096, 32000] fp32: forward 1.79 reads per element, backward 2.8 reads of
# two inputs (model: 2 and 3).
SOFTMAX_ROW_ON_CHIP_BYTES = 48 * 1024
_SOFTMAX_BWD = {"_softmax_backward_data", "_log_softmax_backward_data", "softmax_backward_data"}


def _softmax_passes(row: int, eb: int) -> int:
    return 1 if row <= 1024 or row * eb <= SOFTMAX_ROW_ON_CHIP_BYTES else 2


def cost_softmax(op: str, sizes: Sequence[Shape], eb: int) -> Optional[OpCost]:
    """softmax/log_softmax over the last dim: ~5 FLOPs/element (max, subtract, exp, sum,
    divide); bytes = in (once, or twice for rows too long to stay on chip) + out."""
    if not sizes or not sizes[0]:
        return None
    n = numel(sizes[0])
    reads = _softmax_passes(int(sizes[0][-1]), eb)
    why = "" if reads == 1 else f" (row of {sizes[0][-1]} does not stay on chip: read twice)"
    return OpCost(5.0 * n, float((reads + 1) * n) * eb, "softmax",
                  f"{op}: 5*{n} FLOP; bytes = ({reads}*{n} in + {n} out) * {eb}{why}")


def cost_softmax_backward(op: str, sizes: Sequence[Shape], eb: int) -> Optional[OpCost]:
    """``_softmax_backward_data(grad, output, dim, dtype)``: ~3 FLOPs/element; bytes = grad and
    output read (the grad twice for long rows) + grad_input written."""
    if len(sizes) < 2 or not sizes[0] or not sizes[1]:
        return None
    n = numel(sizes[0])
    grad_reads = _softmax_passes(int(sizes[0][-1]), eb)
    return OpCost(3.0 * n, float((grad_reads + 2) * n) * eb, "softmax",
                  f"{op}: 3*{n} FLOP; bytes = ({grad_reads}*{n} grad + {n} output read + {n} "
                  f"written) * {eb}")


def cost_scatter_into_zeros(op: str, sizes: Sequence[Shape], eb: int,
                            out_elems: Optional[int]) -> Optional[OpCost]:
    """Backward ops that zero a larger gradient and write the incoming one into part of it
    (``slice_backward``, ``select_backward``, ``embedding_dense_backward``, ``nll_loss_backward``):
    the zero fill of the output + the incoming gradient read + its rows written (and indices)."""
    tensors = _tensors(sizes)
    if op == "nll_loss_backward":
        # (grad_output[], self[N, C], target[N], ...): grad_input is self-shaped, zero but one
        # element per row
        if len(tensors) < 2:
            return None
        out, n = numel(tensors[0]), (numel(tensors[1]) if len(tensors) > 1 else 0)
        return OpCost(0.0, float(out * eb + n * INDEX_BYTES), "scatter",
                      f"{op}: 0 FLOP; bytes = {out}*{eb} (zeroed grad_input) + {n}*{INDEX_BYTES} "
                      "(targets)")
    if out_elems is None or not tensors:
        return None
    g = numel(tensors[0])
    idx = numel(tensors[1]) * INDEX_BYTES if op == "embedding_dense_backward" and len(tensors) > 1 else 0
    flops = float(g) if op == "embedding_dense_backward" else 0.0  # rows summed per index
    return OpCost(flops, float(out_elems * eb + 2 * g * eb + idx), "scatter",
                  f"{op}: bytes = {out_elems}*{eb} (zeroed output) + 2*{g}*{eb} (gradient read, "
                  f"written into it)" + (f" + {idx} (indices)" if idx else ""))


# --- gathers and copies ---------------------------------------------------------------------------
def cost_embedding(sizes: Sequence[Shape], eb: int) -> Optional[OpCost]:
    """embedding(W[V, D], idx[...]): 0 FLOPs; bytes = gathered rows (n*D) + indices (8 B each)
    + output (n*D)."""
    if len(sizes) < 2 or len(sizes[0]) < 2 or not sizes[1]:
        return None
    row = numel(sizes[0][1:])
    n = numel(sizes[1])
    out = n * row
    return OpCost(0.0, float(2 * out * eb + n * INDEX_BYTES), "gather",
                  f"embedding: 0 FLOP; bytes = 2*{n}*{row}*{eb} (rows read + out) "
                  f"+ {n}*{INDEX_BYTES} (indices)")


def cost_index_select(sizes: Sequence[Shape], eb: int) -> Optional[OpCost]:
    """index_select(x, dim, idx[n]): rows along dim 0 assumed (dim is not in the shapes);
    bytes = 2 * n * row + indices."""
    tensors = [s for s in sizes if s]
    if len(tensors) < 2 or not sizes[0]:
        return None
    x, idx = sizes[0], tensors[-1]
    n = numel(idx)
    out = n * numel(x[1:])
    return OpCost(0.0, float(2 * out * eb + n * INDEX_BYTES), "gather",
                  f"index_select: 0 FLOP; bytes = 2*{out}*{eb} + {n}*{INDEX_BYTES} (dim 0 assumed)")


def cost_gather(sizes: Sequence[Shape], eb: int) -> Optional[OpCost]:
    """gather(x, dim, idx): output has idx's shape; bytes = 2 * out + indices."""
    if len(sizes) < 3 or not sizes[2]:
        return None
    n = numel(sizes[2])
    return OpCost(0.0, float(2 * n * eb + n * INDEX_BYTES), "gather",
                  f"gather: 0 FLOP; bytes = 2*{n}*{eb} + {n}*{INDEX_BYTES}")


def cost_index(sizes: Sequence[Shape], eb: int) -> Optional[OpCost]:
    """index(x, [idx...]) (advanced indexing on the leading dims, assumed): output =
    broadcast(idx shapes) + x's remaining dims; bytes = 2 * out + indices."""
    if len(sizes) < 2 or not sizes[0]:
        return None
    x, idxs = sizes[0], [s for s in sizes[1:] if s]
    if not idxs:
        return None
    ishape = broadcast_shapes(*idxs)
    if ishape is None or len(idxs) > len(x):
        return None
    out = numel(ishape) * numel(x[len(idxs):])
    nidx = sum(numel(s) for s in idxs)
    return OpCost(0.0, float(2 * out * eb + nidx * INDEX_BYTES), "gather",
                  f"index: 0 FLOP; bytes = 2*{out}*{eb} + {nidx}*{INDEX_BYTES} "
                  "(indices on leading dims assumed)")


def cost_copy(op: str, sizes: Sequence[Shape], eb: int, src_eb: Optional[int] = None,
              dst_eb: Optional[int] = None) -> Optional[OpCost]:
    """copy_(dst, src) / to / _to_copy / contiguous / clone: 0 FLOPs; bytes = read of the source
    at its type + write of the destination at its type (a cast: ``src_eb`` != ``dst_eb``; each
    defaults to ``elem_bytes``)."""
    if not sizes or not sizes[0]:
        return None
    if op == "copy" and len(sizes) > 1 and sizes[1]:
        n_src, n_dst = numel(sizes[1]), numel(sizes[0])
    else:
        n_src = n_dst = numel(sizes[0])
    se, de = src_eb or eb, dst_eb or eb
    body = (f"({n_src} read + {n_dst} written) * {eb}" if se == de == eb else
            f"{n_src} read * {se} + {n_dst} written * {de} (a cast)")
    return OpCost(0.0, float(n_src * se + n_dst * de), "copy", f"{op}: 0 FLOP; bytes = {body}")


def cost_cat(sizes: Sequence[Shape], eb: int) -> Optional[OpCost]:
    """cat(tensors, dim) / stack: 0 FLOPs; bytes = 2 * total elements (read all, write all)."""
    tensors = _tensors(sizes)
    if not tensors:
        return None
    n = sum(numel(s) for s in tensors)
    return OpCost(0.0, float(2 * n) * eb, "copy", f"cat: 0 FLOP; bytes = 2*{n}*{eb}")


# --- GEMM dimensions of an op key ----------------------------------------------------------------
_GEMM_KEY_RE = re.compile(r"^aten::(mm|addmm|bmm) (\[.*\])$")


def gemm_mkn(op_key: str) -> Optional[tuple[int, int, int]]:
    """(M, K, N) of an ``aten::mm/addmm/bmm [sizes]`` op key (recorder keys' `` | tokens`` tail
    ignored), or None."""
    m = _GEMM_KEY_RE.match(str(op_key).split(" | ", 1)[0])
    sizes = literal_sizes(m.group(2)) if m else None
    if sizes is None:
        return None
    shapes = [x for x in sizes if isinstance(x, list) and len(x) >= 2]
    if m.group(1) == "addmm" and len(shapes) >= 3:
        shapes = shapes[1:]
    if len(shapes) < 2:
        return None
    a, b = shapes[0], shapes[1]
    try:
        return int(a[-2]), int(a[-1]), int(b[-1])
    except (TypeError, ValueError):
        return None


# --- foreach (tensor-list) ops and fused optimizers --------------------------------------------
# FLOPs per element of the first list; fused Adam(W): moments, bias correction, update.
FOREACH_FLOPS = {"addcmul": 3, "addcdiv": 3, "lerp": 3, "sqrt": 1, "div": 1, "mul": 1, "add": 1,
                 "sub": 1, "maximum": 1, "norm": 2, "zero": 0, "copy": 0}
_FUSED_OPTIMIZERS = {"_fused_adam": (4, 3, 12), "_fused_adamw": (4, 3, 13),
                     "_fused_sgd": (3, 2, 3)}  # lists read, lists written, FLOP per element
# Most tensor lists a foreach op takes (the rest of its arguments are scalars); emit_nvtx writes
# the lists' tensors one after another, so the lists are recovered by splitting into this many
# equal parts where the parts' shapes agree.
FOREACH_MAX_LISTS = {"addcmul": 3, "addcdiv": 3, "lerp": 3, "add": 2, "sub": 2, "mul": 2,
                     "div": 2, "maximum": 2, "minimum": 2, "pow": 2, "copy": 2, "clamp_min": 2,
                     "clamp_max": 2, "_fused_adam": 5, "_fused_adamw": 5, "_fused_sgd": 3}


def _split_lists(tensors: list, max_lists: int) -> list[list]:
    """Split flattened list arguments into the largest number (<= max_lists) of equal-shaped lists."""
    for k in range(min(max_lists, len(tensors)), 1, -1):
        if len(tensors) % k == 0:
            m = len(tensors) // k
            parts = [tensors[i * m:(i + 1) * m] for i in range(k)]
            if all(p == parts[0] for p in parts[1:]):
                return parts
    return [tensors]


def cost_foreach(op: str, raw_sizes: Sequence, eb: int) -> Optional[OpCost]:
    """``_foreach_<f>[_](lists..., scalars)``: every tensor list read once; the result (the first
    list in place, or a new list) written once. Fused optimizers (``_fused_adam_`` ...): params,
    grads and moments read, params and moments written, at ``elem_bytes`` (fp32 master weights:
    pass 4)."""
    base = op.split("::", 1)[-1].split(".", 1)[0]
    inplace = base.endswith("_")
    base = base.rstrip("_")
    f = base[len("_foreach_"):] if base.startswith("_foreach_") else base
    lists = [e for e in raw_sizes if isinstance(e, list) and e
             and all(isinstance(t, list) for t in e) and any(e)]  # [[], []]: 0-dim steps
    if not lists:
        # emit_nvtx flattens tensor lists: [[a], [b], ..., []]; 0-dim tensors (steps) read []
        flat = [list(e) for e in raw_sizes if isinstance(e, list) and e
                and all(isinstance(d, int) for d in e)]
        if not flat:
            return None
        lists = _split_lists(flat, FOREACH_MAX_LISTS.get(f, FOREACH_MAX_LISTS.get(base, 1)))
    n = sum(numel(t) for t in lists[0])
    if base in _FUSED_OPTIMIZERS:
        reads, writes, per = _FUSED_OPTIMIZERS[base]
        reads = max(reads, len(lists))  # amsgrad adds a fifth list, read and written
        writes += len(lists) - 4 if len(lists) > 4 else 0
        return OpCost(float(per) * n, float((reads + writes) * n) * eb, "optimizer",
                      f"{base}: {per}*{n} FLOP; bytes = ({reads} lists read + {writes} written) "
                      f"* {n} * {eb} ({len(lists[0])} tensors)")
    per = FOREACH_FLOPS.get(f, ELEMENTWISE_FLOPS.get(f, 1))
    if f in ("zero", "copy") or f.startswith("norm"):
        per = FOREACH_FLOPS.get(f, 2)
    read = sum(numel(t) for lst in lists for t in lst)
    if f == "zero":
        read = 0
    written = n if not f.startswith("norm") else len(lists[0])
    return OpCost(float(per) * n, float(read + written) * eb, "foreach",
                  f"{base}: {per}*{n} FLOP over {len(lists[0])} tensors; bytes = ({read} read + "
                  f"{written} written{' in place' if inplace else ''}) * {eb}")


VIEW_OPS = {"view", "reshape", "_unsafe_view", "as_strided", "t", "transpose", "permute",
            "expand", "expand_as", "squeeze", "unsqueeze", "select", "slice", "narrow", "split",
            "chunk", "unbind", "flatten", "unflatten", "detach", "alias", "view_as", "empty",
            "empty_like", "empty_strided", "resize", "lift_fresh", "_reshape_alias", "numpy_T"}


# --- dispatch ---------------------------------------------------------------------------------------
_GEMM = {"mm": cost_mm, "addmm": cost_addmm, "bmm": cost_bmm, "baddbmm": cost_baddbmm,
         "matmul": cost_matmul, "linear": cost_linear}
_CONV = {"conv1d", "conv2d", "conv3d", "convolution", "_convolution", "cudnn_convolution",
         "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "_conv_depthwise2d",
         "mkldnn_convolution", "convolution_overrideable"}
_ATTENTION = {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
              "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention_for_cpu",
              "_flash_attention_forward", "_efficient_attention_forward",
              "_cudnn_attention_forward", "_scaled_dot_product_fused_attention_overrideable"}
_ATTENTION_BWD = {"_scaled_dot_product_flash_attention_backward",
                  "_scaled_dot_product_efficient_attention_backward",
                  "_scaled_dot_product_cudnn_attention_backward", "_flash_attention_backward",
                  "_efficient_attention_backward", "_cudnn_attention_backward"}
_BLHD_ATTENTION_BWD = {"_flash_attention_backward", "_efficient_attention_backward"}
_LAYER_NORM = {"layer_norm", "native_layer_norm"}
_RMS_NORM = {"rms_norm", "_fused_rms_norm"}
_SOFTMAX = {"softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax"}
_COPY = {"copy", "to", "_to_copy", "contiguous", "clone"}
# Backward ops whose output size is an argument the shapes do not show (the recorder's outputs do).
SCATTER_BACKWARD_OPS = {"slice_backward", "select_backward", "embedding_dense_backward",
                        "nll_loss_backward"}


def estimate(op: str, sizes: Sequence[Sequence[int]], elem_bytes: int = 2, *,
             causal: bool = False, src_elem_bytes: Optional[int] = None,
             dst_elem_bytes: Optional[int] = None, raw_sizes: Optional[Sequence] = None,
             out_elems: Optional[int] = None) -> Optional[OpCost]:
    """FLOPs and ideal bytes of one call of ``op`` (``"aten::mm"`` or ``"mm"``) on ``sizes``.

    ``elem_bytes``: bytes per element (2 for bf16/fp16, 4 for fp32); ``causal``: the attention
    was causal (the flash/efficient/cudnn variants' arguments do not show it);
    ``src_elem_bytes``/``dst_elem_bytes``: a cast's source and destination element sizes (copy
    ops; elementwise ops take ``dst_elem_bytes`` for their output); ``raw_sizes``: the
    unflattened sizes (tensor lists kept), needed by foreach ops; ``out_elems``: the output's
    element count where recorded (reductions: output written). Returns None when profkit has
    no model for the op or the shapes do not fit it.
    """
    name = normalize_op(op)
    sz: list[Shape] = [[int(d) for d in s] if s else [] for s in (sizes or [])]
    eb = int(elem_bytes)
    overload = op.split("::", 1)[-1].split(".", 1)[1] if "." in op.split("::", 1)[-1] else ""
    try:
        if name.startswith("_foreach_") or name in _FUSED_OPTIMIZERS:
            return cost_foreach(op, raw_sizes if raw_sizes is not None else [sz], eb)
        if name in _GEMM:
            return _GEMM[name](sz, eb)
        if name in _CONV:
            return cost_conv(sz, eb)
        if name in _ATTENTION:
            layout = "BLHD" if name in _BLHD_ATTENTION else "BHLD"
            return cost_attention(sz, eb, causal=causal, layout=layout)
        if name in _ATTENTION_BWD:
            layout = "BLHD" if name in _BLHD_ATTENTION_BWD else "BHLD"
            return cost_attention_backward(sz, eb, causal=causal, layout=layout)
        if name in _LAYER_NORM:
            return cost_layer_norm(sz, eb)
        if name in _RMS_NORM:
            return cost_rms_norm(sz, eb)
        if name in _SOFTMAX:
            return cost_softmax(name, sz, eb)
        if name in _SOFTMAX_BWD:
            return cost_softmax_backward(name, sz, eb)
        if name in SCATTER_BACKWARD_OPS:
            return cost_scatter_into_zeros(name, sz, eb, out_elems)
        if name == "embedding":
            return cost_embedding(sz, eb)
        if name == "index_select":
            return cost_index_select(sz, eb)
        if name == "gather":
            return cost_gather(sz, eb)
        if name == "index":
            return cost_index(sz, eb)
        if name in _COPY:
            return cost_copy(name, sz, eb, src_elem_bytes, dst_elem_bytes)
        if name in ("cat", "stack", "concat", "concatenate"):
            return cost_cat(sz, eb)
        if name in REDUCTION_OPS:
            return cost_reduction(name, sz, eb, out_elems, dst_elem_bytes)
        if name in ELEMENTWISE_OPS:
            return cost_elementwise(name, sz, eb, overload, dst_elem_bytes)
        if name in VIEW_OPS:
            return OpCost(0.0, 0.0, "view", f"{name}: metadata only, no kernel")
    except (IndexError, ValueError, TypeError):
        return None
    return None


def estimate_call(call: AtenCall, elem_bytes: int = 2, *, causal: bool = False) -> Optional[OpCost]:
    return estimate(call.op, call.sizes, elem_bytes, causal=causal, raw_sizes=call.raw_sizes)


def has_model(op: str) -> bool:
    name = normalize_op(op)
    return (name in _GEMM or name in _CONV or name in _ATTENTION or name in _ATTENTION_BWD
            or name in _LAYER_NORM
            or name in _RMS_NORM or name in _SOFTMAX or name in _SOFTMAX_BWD
            or name in SCATTER_BACKWARD_OPS or name in _COPY or name in REDUCTION_OPS
            or name in ELEMENTWISE_OPS or name in VIEW_OPS or name.startswith("_foreach_")
            or name in _FUSED_OPTIMIZERS
            or name in ("embedding", "index_select", "gather", "index", "cat", "stack",
                        "concat", "concatenate"))


# Ops that normally only dispatch to another modeled op (the callee's range carries the work).
WRAPPER_OPS: dict[str, tuple[str, ...]] = {
    "linear": ("addmm", "mm", "matmul", "bmm"),
    "matmul": ("mm", "bmm", "dot", "mv"),
    "conv1d": ("convolution",), "conv2d": ("convolution",), "conv3d": ("convolution",),
    "convolution": ("_convolution",), "_convolution": ("cudnn_convolution",),
    "conv_transpose1d": ("convolution",), "conv_transpose2d": ("convolution",),
    "conv_transpose3d": ("convolution",),
    "scaled_dot_product_attention": ("_scaled_dot_product_flash_attention",
                                     "_scaled_dot_product_efficient_attention",
                                     "_scaled_dot_product_cudnn_attention",
                                     "_scaled_dot_product_attention_math"),
    "_scaled_dot_product_flash_attention": ("_flash_attention_forward",),
    "_scaled_dot_product_efficient_attention": ("_efficient_attention_forward",),
    "_scaled_dot_product_cudnn_attention": ("_cudnn_attention_forward",),
    "_scaled_dot_product_flash_attention_backward": ("_flash_attention_backward",),
    "_scaled_dot_product_efficient_attention_backward": ("_efficient_attention_backward",),
    "_scaled_dot_product_cudnn_attention_backward": ("_cudnn_attention_backward",),
    "layer_norm": ("native_layer_norm",),
    "rms_norm": ("_fused_rms_norm",),
    "softmax": ("_softmax",), "log_softmax": ("_log_softmax",),
    "embedding": ("index_select",),
    "to": ("_to_copy",), "_to_copy": ("copy_",), "contiguous": ("clone",), "clone": ("copy_",),
    "dropout": ("native_dropout",),
}


def aten_is_wrapper(op: str) -> bool:
    """True for ops whose work is normally done by a nested aten op (see :data:`WRAPPER_OPS`):
    attribute to the innermost modeled range instead, never to both."""
    return normalize_op(op) in WRAPPER_OPS or op.split("::", 1)[-1].split(".")[0] in WRAPPER_OPS


def innermost_modeled(stack: Iterable[AtenCall | str], elem_bytes: int = 2, *,
                      causal: bool = False) -> Optional[tuple[AtenCall, OpCost]]:
    """From the aten ranges around one kernel launch (outermost first; texts or AtenCalls),
    the innermost one with a non-view model, and its cost; None when none has one."""
    calls = [c if isinstance(c, AtenCall) else parse_aten_range(c) for c in stack]
    for call in reversed([c for c in calls if c is not None]):
        cost = estimate_call(call, elem_bytes, causal=causal)
        if cost is not None and cost.kind != "view":
            return call, cost
    return None


DTYPE_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


# --- attention as flash attention does it --------------------------------------------------------
FLASH_BACKWARD_FLOPS = 2.5   # the backward's GEMMs over the forward's: S recomputed, dV, dP, dQ, dK


def flash_attention_work(batch_heads: int, sq: int, sk: int, d: int, dv: int, causal: bool,
                         backward: bool, elem_bytes: int = 2) -> tuple[float, float]:
    """(FLOPs, bytes) of one attention call as flash attention does it: the forward's two GEMMs,
    2*B*H*Sq*Sk*(D + Dv) FLOPs (4*B*H*Sq*Sk*D when Dv = D), half of it under a causal mask; the
    backward 2.5 times the forward's FLOPs. Bytes: Q, K, V and O read or written once (the
    backward: those and dO, dQ, dK, dV); the score matrix never leaves the chip."""
    flops = 2.0 * batch_heads * sq * sk * (d + dv)
    if causal:
        flops /= 2.0
    once = float(elem_bytes) * batch_heads * (sq * d + sk * d + sk * dv + sq * dv)
    if backward:
        return flops * FLASH_BACKWARD_FLOPS, 2.0 * once
    return flops, once
