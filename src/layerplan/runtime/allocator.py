"""Freed memory stays in the process: every rank and every calibration benchmark process turns off
glibc's return of large blocks to the kernel, so a training step's large buffers are not faulted in
again, page by page, every step.

PyTorch's CPU allocator is the C library's malloc. A block over glibc's mmap threshold (at most
32 MiB) gets its own mapping, and ``free`` unmaps it, so the next step's block of the same size
faults in and zeroes every page again. A training step allocates its gradients afresh
(``zero_grad(set_to_none=True)``) and the weight gradient of a large FC layer is such a block:
alexnet_cifar's two large layers have 38 and 67 MB of weights. Measured here, one thread, batch 16:

- the FC phase's forward + backward took 77-80 ms with glibc's defaults and 43-44 ms with freed
  memory kept; a whole training step of the net 182-187 ms against 140-148 ms; the process took
  2.3 million page faults against 0.25 million, at the same peak memory (1.27 GB);
- with the defaults, whether a block is served from memory already in the heap or from a fresh
  mapping depends on what the process freed before, so the same pass timed in two processes read
  29 ms or 63 ms of backward: two calibrations of the same machine disagreed by 2x on the FC
  phase, and so did two runs of the same configuration.

``M_MMAP_MAX = 0`` serves every block from the heap; ``M_TRIM_THRESHOLD`` = 1 GiB keeps freed heap
memory unless more than that is free at its top. The heap still grows for a process's first few
blocks of a size (torch asks for 64-byte aligned blocks, a few bytes more than a freed one holds,
until freed neighbours coalesce): 1-9 blocks of 64 MiB here, a step or two of training. Set
``LAYERPLAN_KEEP_FREED_MEMORY=0`` to leave the C library's defaults (``benchmarks/allocator.py``
measures both).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_MAX = -4
TRIM_THRESHOLD_BYTES = 2**30
ENV = "LAYERPLAN_KEEP_FREED_MEMORY"


def keep_freed_memory() -> bool:
    """Apply the settings above to this process (glibc only; call it before the work allocates).
    Returns whether they were applied: False elsewhere (another C library, or ``ENV`` = 0)."""
    if os.environ.get(ENV, "1").strip().lower() in ("0", "no", "false", "off"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to set
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
