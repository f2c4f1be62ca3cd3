"""The aten op record that ``profkit capture --aten`` writes into each NVTX range, and its parser.

Reading layer: pure Python, no torch, imports nothing from the judging modules. The writer is
:mod:`profkit.capture.recorder` (capture side); this module owns the format so both sides agree.

A recorded range reads like an ``emit_nvtx`` range (op name first, then ``sizes = [[...]]``, one
entry per schema argument, ``[]`` for non-tensors), so everything that parses emit_nvtx text keeps
working, with the record appended after ``, pk = ``::

    aten::mm, sizes = [[4096, 1024], [1024, 4096]], pk = in=bf16*2 c=10 out=bf16[4096,4096]
    aten::_scaled_dot_product_flash_attention, sizes = [[8, 16, 512, 64], ...], pk = in=bf16*3,-*4 c=111---- causal=1 p=0 out=bf16[8,16,512,64];fp32[8,16,512]

Tokens (space-separated ``key=value``; a token is left out when the op has no such argument):

``in``      element type of each ``sizes`` entry (tensor lists flattened), ``-`` for a non-tensor;
            runs of one value are written ``VALUE*N``
``c``       one character per ``sizes`` entry: ``1`` contiguous, ``0`` not, ``-`` not a tensor
``out``     the outputs, ``TYPE[d0,d1]`` joined by ``;`` (``TYPE*N`` for more than four); left
            out on the first call of an input signature, whose outputs are not known yet
``outarg``  ``1``: an ``out=`` tensor was given (it is written, not read)
``causal``  SDPA-family ``is_causal``; ``p`` dropout probability; ``scale`` softmax scale
``dim``     reduction dims (``-1`` or ``0,1``); ``keepdim`` ``0``/``1``
``alpha``   the ``alpha`` scalar of add/sub-like ops; ``dtype`` a requested output type
``same``    ``I:J`` pairs, comma-separated: ``sizes`` entry ``I`` is the tensor (or, for a list,
            starts with the tensor) of entry ``J``, so it is read once (``x * x``, the
            optimizer's ``addcmul_(v, grads, grads)``)
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Iterable, Optional

MARKER = ", pk = "
# The NVTX mark the recorder leaves when its block ends: the host time (ns) it added per op it
# recorded (profkit.capture.recorder.AtenRecorder.host_cost_ns), for the step model to take off
# the CPU.
RECORDER_COST_MARK = "profkit.recorder cost_ns_per_op="
# Producer -> consumer pairs that a bundled kernel fuses (consumer op prefixes, producer op
# prefixes, bundled kernel): the recorder gives these ops their op ids, profkit.judge.patterns
# finds the pairs.
FUSABLE_PAIRS = [
    (("aten::_fused_rms_norm", "aten::rms_norm"), ("aten::add",), "add_rmsnorm"),
    (("aten::native_layer_norm", "aten::layer_norm"), ("aten::add",), "add_layernorm"),
    (("aten::gelu",), ("aten::add",), "bias_gelu"),
    (("aten::_softmax", "aten::softmax"), ("aten::mul", "aten::div"), "softmax"),
]

VERSION = 1

# Short element-type names, shared with profkit.judge.dtypes' precision names where they overlap.
DTYPE_BYTES: dict[str, int] = {
    "fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp8e4m3": 1, "fp8e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "c64": 8, "c128": 16,
}
FLOATING = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "fp8e4m3", "fp8e5m2")

Shape = list[int]


@dataclass(frozen=True)
class AtenRecord:
    """One recorded aten op call, typed."""
    op: str                                   # aten::name[.overload]
    sizes: list[Shape]                        # flattened, one entry per tensor or argument
    raw_sizes: list = field(compare=False, repr=False, default_factory=list)
    in_dtypes: tuple[Optional[str], ...] = ()  # per sizes entry; None: not a tensor
    contiguous: tuple[Optional[bool], ...] = ()
    outputs: Optional[tuple[tuple[str, Optional[Shape]], ...]] = None  # None: not recorded
    out_arg: bool = False
    causal: Optional[bool] = None
    dropout_p: Optional[float] = None
    scale: Optional[float] = None
    dim: Optional[tuple[int, ...]] = None
    keepdim: Optional[bool] = None
    alpha: Optional[float] = None
    dtype: Optional[str] = None               # the dtype= argument (casts, factory ops)
    same: tuple[tuple[int, int], ...] = ()    # (entry, earlier entry it repeats), raw positions

    def without_repeats(self) -> list:
        """``raw_sizes`` with each repeated argument blanked (``[]``): what is read, once."""
        drop = {i for i, _ in self.same}
        return [[] if i in drop else e for i, e in enumerate(self.raw_sizes)]

    @property
    def tensor_dtypes(self) -> list[str]:
        return [d for d in self.in_dtypes if d is not None]

    @property
    def out_dtypes(self) -> list[str]:
        return [d for d, _ in (self.outputs or ())]


# --- writing (used by the recorder; plain strings, no torch) --------------------------------------
def run_length(values: Iterable[str]) -> str:
    """``a,a,a,b`` -> ``a*3,b``: tensor lists repeat one type many times."""
    out: list[str] = []
    prev, n = None, 0
    for v in values:
        if v == prev:
            n += 1
            continue
        if prev is not None:
            out.append(prev if n == 1 else f"{prev}*{n}")
        prev, n = v, 1
    if prev is not None:
        out.append(prev if n == 1 else f"{prev}*{n}")
    return ",".join(out)


def format_outputs(outs: list[tuple[str, Optional[Shape]]]) -> str:
    if len(outs) > 4:
        return run_length(d for d, _ in outs)
    return ";".join(d if s is None else f"{d}[{','.join(map(str, s))}]" for d, s in outs)


# --- reading -------------------------------------------------------------------------------------
_OP_RE = re.compile(r"^\s*(?P<op>[A-Za-z_]\w*::[\w.]+)\s*,")
_OUT_RE = re.compile(r"^(?P<d>[A-Za-z0-9]+)(?:\[(?P<s>[0-9,]*)\])?$")


def balanced(text: str, start: int) -> Optional[str]:
    """The bracketed text starting at ``text[start] == '['``, brackets balanced."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth == 0:
                return text[start:i + 1]
    return None


def literal_sizes(block: str) -> Optional[list]:
    """The ``[...]`` sizes block as a Python list, or None when it is not one (damaged text)."""
    try:
        raw = ast.literal_eval(block)
    except (ValueError, SyntaxError):
        return None
    return raw if isinstance(raw, list) else None


def flatten_sizes(raw: list) -> list[Shape]:
    """Input sizes as recorded (emit_nvtx and the recorder alike): one shape per tensor, a tensor
    list expanded to one entry per tensor, ``[]`` for a non-tensor argument."""
    out: list[Shape] = []
    for entry in raw:
        if isinstance(entry, list) and entry and all(isinstance(e, list) for e in entry):
            out.extend([[int(d) for d in e] for e in entry])
        elif isinstance(entry, list):
            out.append([int(d) for d in entry])
        else:
            out.append([])
    return out


def _expand(text: str) -> list[str]:
    vals: list[str] = []
    for part in text.split(","):
        if not part:
            continue
        v, _, n = part.partition("*")
        vals.extend([v] * (int(n) if n else 1))
    return vals


def _float(v: str) -> Optional[float]:
    try:
        return float(v)
    except ValueError:
        return None


def split_payload(text: str) -> tuple[str, Optional[str]]:
    """(the emit_nvtx-compatible head, the record's tokens or None)."""
    at = text.find(MARKER)
    if at < 0:
        return text, None
    return text[:at], text[at + len(MARKER):]


def is_recorded(text: str) -> bool:
    return isinstance(text, str) and MARKER in text


def group_key(text: str) -> Optional[str]:
    """``aten::op [sizes] | tokens`` for a recorded range (outputs left out, since the first call
    of a signature has none), or None when ``text`` is not a recorded range."""
    if not is_recorded(text):
        return None
    head, tokens = split_payload(text)
    found = _op_and_block(head)
    if found is None:
        return None
    op, block = found
    kept = " ".join(t for t in (tokens or "").split() if not t.startswith("out="))
    return f"{op} {block} | {kept}" if kept else f"{op} {block}"


def _op_and_block(head: str) -> Optional[tuple[str, str]]:
    """The op name and the bracketed ``sizes = [...]`` block of a range's head, or None."""
    m = _OP_RE.match(head)
    at = head.find("sizes = [")
    if not m or at < 0:
        return None
    block = balanced(head, at + len("sizes = "))
    return None if block is None else (m.group("op"), block)


def parse(text: str) -> Optional[AtenRecord]:
    """The record of one recorded range (or of its group key); None for anything else
    (emit_nvtx text, user ranges, damaged text)."""
    if not isinstance(text, str):
        return None
    if MARKER in text:
        head, tokens = split_payload(text)
    elif " | " in text:
        head, tokens = text.split(" | ", 1)
        head = head.replace(" [", ", sizes = [", 1)
    else:
        return None
    found = _op_and_block(head if "," in head else head + ",")
    if found is None:
        return None
    op, block = found
    raw = literal_sizes(block)
    if raw is None:
        return None
    try:
        sizes = flatten_sizes(raw)
    except (TypeError, ValueError):
        return None
    kw: dict = {}
    for tok in (tokens or "").split():
        key, _, val = tok.partition("=")
        if key == "in":
            kw["in_dtypes"] = tuple(None if v == "-" else v for v in _expand(val))
        elif key == "c":
            kw["contiguous"] = tuple({"1": True, "0": False}.get(ch) for ch in val)
        elif key == "out":
            outs: list[tuple[str, Optional[Shape]]] = []
            parts = val.split(";") if "[" in val or ";" in val else _expand(val)
            for part in parts:
                om = _OUT_RE.match(part)
                if om:
                    s = om.group("s")
                    outs.append((om.group("d"), [int(d) for d in s.split(",") if d] if s is not None
                                 else None))
            kw["outputs"] = tuple(outs)
        elif key == "outarg":
            kw["out_arg"] = val == "1"
        elif key == "causal":
            kw["causal"] = val == "1"
        elif key == "keepdim":
            kw["keepdim"] = val == "1"
        elif key == "p":
            kw["dropout_p"] = _float(val)
        elif key == "scale":
            kw["scale"] = _float(val)
        elif key == "alpha":
            kw["alpha"] = _float(val)
        elif key == "dim":
            try:
                kw["dim"] = tuple(int(v) for v in val.split(",") if v)
            except ValueError:
                pass
        elif key == "dtype":
            kw["dtype"] = val
        elif key == "same":
            pairs = []
            for part in val.split(","):
                i, _, j = part.partition(":")
                if i.isdigit() and j.isdigit() and int(j) < int(i) < len(raw):
                    pairs.append((int(i), int(j)))
            kw["same"] = tuple(pairs)
    if len(kw.get("in_dtypes", ())) != len(sizes):
        kw.pop("in_dtypes", None)  # damaged or from another version: no per-entry types
    return AtenRecord(op=op, sizes=sizes, raw_sizes=raw, **kw)


def records_by_key(names: Iterable[str], key_of) -> dict[str, AtenRecord]:
    """One record per op key (``key_of``: range name -> op key), with outputs where any call of
    the op recorded them."""
    out: dict[str, AtenRecord] = {}
    for name in dict.fromkeys(names):
        if not is_recorded(name):
            continue
        key = key_of(name)
        have = out.get(key)
        if have is not None and have.outputs is not None:
            continue
        rec = parse(name)
        if rec is not None and (have is None or rec.outputs is not None):
            out[key] = rec
    return out
