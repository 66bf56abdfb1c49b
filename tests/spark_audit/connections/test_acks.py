"""Produce acks read with numpy from the Arrow buffers agree with the proxy's own parser."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import parse_request_header
from protocol import produce_acks as proxy_acks
from spark_audit.connections import produce_acks
from tests.support.audit_builders import produce_frame

CASES = [
    dict(version=v, acks=a, transactional_id=t, client_id=c)
    for v in (0, 2, 3, 7, 8, 9, 11, 12)
    for a in (0, 1, -1)
    for t in (None, "tx-1", "t" * 130)
    for c in ("client", None, "x" * 200)
    if not (t and v < 3)
]


def _read(frames: list[bytes | None], versions: list[int], rows: list[int] | None = None) -> list[int]:
    array = pa.array(frames, pa.binary())
    at = np.arange(len(frames)) if rows is None else np.array(rows)
    return produce_acks(array, at, np.array(versions)[at]).tolist()


def test_acks_match_the_proxys_parser():
    frames = [produce_frame(7, **case) for case in CASES]
    expected = [proxy_acks(f, parse_request_header(f)) for f in frames]
    got = _read(frames, [c["version"] for c in CASES])
    readable = [-1 if c["transactional_id"] == "t" * 130 and c["version"] >= 9 else c["acks"] for c in CASES]
    assert got == readable
    assert [g for g, e in zip(got, expected, strict=True) if g != -1 and g != e] == []


@settings(max_examples=200, deadline=None)
@given(case=st.sampled_from(CASES), cut=st.integers(0, 400), before=st.binary(max_size=20))
def test_a_cut_frame_gives_unknown_and_neighbours_do_not_matter(case, cut, before):
    frame = produce_frame(7, **case)
    cut_frame = frame[:cut]
    got = _read([before, cut_frame, None], [case["version"]] * 3, rows=[1])
    whole = _read([frame], [case["version"]])
    assert got == (whole if cut >= len(frame) else got)
    assert got[0] in (-1, whole[0])
    if cut < 14:
        assert got == [-1]


def test_only_the_chosen_rows_are_read():
    frames = [produce_frame(7, acks=0), None, produce_frame(9, acks=1)]
    assert _read(frames, [7, 7, 9], rows=[2, 0]) == [1, 0]
