"""Produce acks read by Spark expressions agree with the proxy's own parser."""

from __future__ import annotations

import pytest

from protocol import parse_request_header, produce_acks
from spark_audit.decode import with_produce_acks
from tests.support.audit_builders import produce_frame

CASES = [
    dict(version=v, acks=a, transactional_id=t, client_id=c)
    for v in (0, 2, 3, 7, 8, 9, 11)
    for a in (0, 1, -1)
    for t in (None, "tx-1")
    for c in ("client", None, "x" * 200)
    if not (t and v < 3)
]


def test_acks_column_matches_protocol_produce_acks(spark):
    frames = [produce_frame(7, **case) for case in CASES]
    expected = [produce_acks(f, parse_request_header(f)) for f in frames]
    df = spark.createDataFrame(
        [(f, c["version"]) for f, c in zip(frames, CASES, strict=True)], "frame binary, v short"
    )
    got = [r.acks for r in with_produce_acks(df, version="v").collect()]
    assert got == expected == [c["acks"] for c in CASES]


@pytest.mark.parametrize("cut", [0, 8, 13])
def test_a_cut_frame_gives_null(spark, cut):
    frame = produce_frame(7, acks=0)[:cut]
    df = spark.createDataFrame([(frame, 9)], "frame binary, v short")
    assert with_produce_acks(df, version="v").first().acks is None
