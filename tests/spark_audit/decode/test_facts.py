"""The mapInArrow pass that decodes broker-side bodies in the executors."""

from __future__ import annotations

from protocol import response_class
from protocol.testing import encode_response
from spark_audit.decode import decode_facts
from tests.support.audit_builders import CAPTURE, capture_df, produce_frame, req, resp


def test_decode_facts_runs_in_the_executors_on_the_broker_side(spark):
    ack = response_class(0)
    body = ack(
        version=9,
        responses=[
            ack.TopicProduceResponse(
                name="t",
                partition_responses=[
                    ack.TopicProduceResponse.PartitionProduceResponse(index=0, error_code=0, base_offset=1)
                ],
            )
        ],
    )
    frame = produce_frame(5)
    answer = encode_response(body, 5)
    rows = [
        req("c", 1, "client", 0, cid=5, frame=frame, frame_length=len(frame), api_version=9),
        req("c", 2, "upstream", 0, cid=5, uid=0, frame=frame, frame_length=len(frame), api_version=9),
        resp("c", 3, "upstream", 0, cid=5, uid=0, frame=answer, frame_length=len(answer), api_version=9),
        resp("c", 4, "client", 0, cid=5, uid=0, frame=answer, frame_length=len(answer), api_version=9),
    ]
    got = (
        decode_facts(capture_df(spark, rows)).select("capture_id", "seq", "correlation_id", "fact").collect()
    )
    assert sorted(tuple(r) for r in got) == [(CAPTURE, 2, 0, "produce_batch"), (CAPTURE, 3, 0, "produce_ack")]
