"""The op table's kernel names (attrs["kernels_of"]) are shared by the frames derived from it,
not deep-copied into each: pandas copies attrs into every column read and every row."""
from __future__ import annotations

import shared


def test_derived_frames_share_the_kernel_names():
    df = shared.corpus("t5_finetune").ops(by="kernel")
    kernels_of = df.attrs["kernels_of"]
    assert kernels_of and all(isinstance(v, set) for v in kernels_of.values())
    assert df["class"].attrs["kernels_of"] is kernels_of
    assert next(df.iterrows())[1].attrs["kernels_of"] is kernels_of
    assert df.copy(deep=True).attrs["kernels_of"] is kernels_of
