"""The worker's heap keeps freed arrays: allocating one again costs no page faults."""

from __future__ import annotations

import resource

import numpy as np

from spark_audit.connections import _heap as heap
from spark_audit.connections._heap import keep_heap

ARRAY = 4 << 20
"""float64 values: 32 MB, past glibc's largest default mapping threshold."""


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_an_array_allocated_again_reuses_the_heap():
    assert keep_heap()
    assert keep_heap()  # once per process, and says so again
    np.ones(ARRAY)  # the heap grows once
    before = _faults()
    for _ in range(10):
        np.ones(ARRAY)
    assert _faults() - before < 10  # without it: a mapping per array, hundreds of faults each


class _OldGlibc:
    """A C library whose ``mallopt`` refuses a mapping threshold over 32 MiB."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def mallopt(self, option: int, value: int) -> int:
        self.calls.append((option, value))
        return 0 if option == heap._M_MMAP_THRESHOLD and value > heap.OLD_GLIBC_MMAP_THRESHOLD else 1


def test_an_older_glibc_gets_the_largest_threshold_it_takes_and_the_trim_one(monkeypatch):
    libc = _OldGlibc()
    monkeypatch.setattr(heap, "_kept", None)
    monkeypatch.setattr(heap.ctypes, "CDLL", lambda name: libc)
    assert heap.keep_heap()
    assert libc.calls == [
        (heap._M_MMAP_THRESHOLD, heap.MMAP_THRESHOLD),
        (heap._M_MMAP_THRESHOLD, heap.OLD_GLIBC_MMAP_THRESHOLD),
        (heap._M_TRIM_THRESHOLD, heap.TRIM_THRESHOLD),
    ]
