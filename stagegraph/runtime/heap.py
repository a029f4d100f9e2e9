"""Keep freed heap pages for the next call of generated code.

Generated functions allocate their intermediate tensors and packing buffers with ``malloc``
on every call. glibc serves blocks above its mmap threshold (128 KiB, adapting up to
32 MiB) with fresh ``mmap``s and unmaps them on ``free``, so every call page-faults its
buffers in again: measured 1.8 ms of faults for 0.3 ms of work (two 2 MiB temporaries of an
elementwise chain), and half the time of a bf16 matmul's widened copy. Raising the mmap
and trim thresholds keeps such blocks on the heap, reused from call to call.

Process-wide, on purpose and once: the process keeps up to 1 GiB of freed heap instead of
returning it to the system.
"""

from __future__ import annotations

import ctypes
import functools

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_THRESHOLD = 1 << 30


@functools.cache
def keep_heap_pages() -> bool:
    """Raise glibc's mmap and trim thresholds to 1 GiB; False where there is no glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(
        libc.mallopt(_M_MMAP_THRESHOLD, _THRESHOLD) and libc.mallopt(_M_TRIM_THRESHOLD, _THRESHOLD)
    )
