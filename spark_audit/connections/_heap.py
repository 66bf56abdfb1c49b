"""The Python worker keeps freed memory for the next array instead of giving it back.

The pass makes numpy temporaries of megabytes (a partition's column is 10 MB). glibc's malloc
serves those with fresh mappings and returns them when freed, so each new one is
page-faulted in again, zeroed by the kernel: about 45,000 faults and 0.1-0.2 CPU-s of
kernel time per 1.25 M-row partition, measured here. Higher thresholds keep them in the
heap. It is a process-wide setting, so it is made once, in the worker's ``read()``.
"""

from __future__ import annotations

import ctypes
import ctypes.util

MMAP_THRESHOLD = 64 << 20
"""Allocations below this come from the heap, not from a mapping of their own."""
OLD_GLIBC_MMAP_THRESHOLD = 32 << 20
"""The most an older glibc accepts (half its fixed 64 MiB heap size on 64 bits)."""
TRIM_THRESHOLD = 256 << 20
"""Free memory at the heap's top is given back to the kernel only above this: what a
1.25 M-row partition frees and allocates again (at 64 or 128 MB, 60 % of the faults stay).
So an idle worker may hold this much more than it uses."""
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameters (malloc.h)."""

_kept: bool | None = None


def keep_heap() -> bool:
    """Raise the C library's thresholds, once per process; False where there is no
    ``mallopt`` (a C library other than glibc) or it refused both: nothing changes then.
    Older glibc refuses a mapping threshold over 32 MiB: that one is tried next."""
    global _kept
    if _kept is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):
            _kept = False
        else:
            mapped = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) or bool(
                mallopt(_M_MMAP_THRESHOLD, OLD_GLIBC_MMAP_THRESHOLD)
            )
            trimmed = bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
            _kept = mapped or trimmed
    return _kept
