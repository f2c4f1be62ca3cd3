"""Whether a run still loaded new GPU code in nearly every iteration: a warm-up not over.

A library that compiles a kernel per new shape (cuDNN's runtime-compiled attention and
convolution engines, NVRTC, a torch.compile that recompiles) loads a module or library each
time (``cuModuleLoadData``, ``cuLibraryLoadData``...). A decode loop whose KV cache grows a
position per token meets a new shape every token until its first pass over the lengths ends;
from then on every shape is cached and the loads stop. A capture cut short inside that first
pass (``--max-iterations``) holds no steady iteration at all: the step it shows, tens of
milliseconds of compilation a token, is not the one the program runs for the rest of its life
(a beam search over 48-token searches: 33 ms a token in its first 30 iterations, 1.7 ms once
every length was built). ``profkit capture`` asks this of its profiled trace and captures again
with more iterations when the answer is yes; PK108 prices the loads of a window that has them.
"""
from __future__ import annotations

import re
from typing import Optional

import numpy as np

# The CUDA driver's and runtime's module/library loads (the runtime's cudaLibraryLoad... too)
CODE_LOAD_RE = re.compile(r"^cu(da)?(Module|Library)Load")
# Iterations (after the first) that loaded code, as a share of them, for "nearly every one"
STILL_LOADING_SHARE = 0.8
# ... and the last iterations of the run all did: the loads had not stopped when it ended
LAST_LOADING = 3


def loading_iterations(trace) -> Optional[tuple[int, int, bool]]:
    """(iterations after the first that loaded GPU code, those iterations, whether the last
    LAST_LOADING of them all did) for the range that marks the trace's iterations (as the
    window's ``auto`` picks it); None without such a range."""
    from profkit.run.window import iteration_instances
    found = iteration_instances(trace)
    if found is None:
        return None
    starts = np.sort(found[1]["start"].to_numpy(np.int64))
    if len(starts) < 2:
        return None
    loads = trace.api_calls_matching(CODE_LOAD_RE)
    at = np.sort(loads["start"].to_numpy(np.int64)) if len(loads) else np.zeros(0, np.int64)
    # iteration i spans [starts[i], starts[i + 1]), the last one to the end of the trace
    which = np.searchsorted(starts, at, side="right") - 1
    per = np.bincount(which[which >= 1], minlength=len(starts))[1:len(starts)]
    loaded = per > 0
    return int(loaded.sum()), len(loaded), bool(loaded[-LAST_LOADING:].all())


def still_loading(trace) -> bool:
    """Whether nearly every iteration of ``trace`` after the first loaded new GPU code, the
    last ones included: the run ended inside a warm-up."""
    got = loading_iterations(trace)
    if got is None:
        return False
    loaded, n, last = got
    return n >= LAST_LOADING and last and loaded >= STILL_LOADING_SHARE * n
