"""The worker's heap keeps freed arrays: allocating one again costs no page faults."""

from __future__ import annotations

import resource

import numpy as np

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
