"""Keep the trainer's freed activation memory in its heap instead of handing it back to the OS every step.

Owns one process-wide setting of glibc's allocator (`mallopt`), made once at the start of a training process.

Why: a CPU training step allocates and frees activations and gradients of a few MB each. glibc serves a block above
its mmap threshold (128 KB, rising only to the largest block freed so far) with a fresh `mmap` and returns it with
`munmap` when freed, and it trims the top of the heap back to the OS once 2x that threshold is free. Each step then
touches new pages again: on the default job (256 samples x 13 tokens, the built-in model) that was 3,000-6,000 page
faults and 8-14 ms of kernel time per step. With the mmap threshold fixed at 256 MiB and the trim threshold at
512 MiB, blocks under 256 MiB come from the heap and stay mapped between steps: 140-230 faults and ~1 ms of kernel
time per step (`tests/unit/test_training_heap.py` counts the faults; benchmarks/efficiency.py's training part and
the end-to-end run call this the same way). Blocks of 256 MiB or more are mmapped as before, so a large model's
one-off buffers still go back to the OS; the heap keeps at most 512 MiB free before it trims.

A no-op where the C library is not glibc (musl, macOS): `keep_freed_memory()` returns False there.
"""

from __future__ import annotations

import ctypes
import logging
import platform

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 256 << 20
TRIM_THRESHOLD_BYTES = 512 << 20


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds for this process (see the module docstring); True when they were set."""
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)  # this process's own symbols, glibc's among them (no `find_library` subprocess)
    ok = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    if not ok:
        log.warning("mallopt refused the trainer's heap thresholds; freed activations go back to the OS every step")
    return ok
