"""Known Kafka request/response frames, built with kafka-python, for the wire-capture tests."""

from __future__ import annotations

from dataclasses import dataclass

from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

import protocol
from protocol import ApiKey
from protocol.testing import encode_request, encode_response


def join_group_request(
    version: int,
    rebalance_timeout_ms: int,
    session_timeout_ms: int = 10_000,
    member_id: str = "",
    correlation_id: int = 7,
) -> bytes:
    """A JoinGroup of group "g" as a consumer sends it; v0 has no rebalance timeout of its own."""
    fields = {"rebalance_timeout_ms": rebalance_timeout_ms} if version >= 1 else {}
    message = protocol.request_class(ApiKey.JOIN_GROUP)[version](
        group_id="g",
        session_timeout_ms=session_timeout_ms,
        member_id=member_id,
        protocol_type="consumer",
        protocols=[],
        **fields,
    )
    return encode_request(message, correlation_id, "c")


@dataclass(frozen=True)
class Exchange:
    """One request and (unless acks=0) its response."""

    api_key: int
    api_version: int
    correlation_id: int
    request: bytes
    response: bytes | None


def api_versions(correlation_id: int) -> Exchange:
    request = encode_request(
        ApiVersionsRequest[3](client_software_name="corrfix-tests", client_software_version="1"),
        correlation_id,
        "wire-test",
    )
    response = encode_response(ApiVersionsResponse[3](error_code=0, api_keys=[]), correlation_id)
    return Exchange(ApiKey.API_VERSIONS, 3, correlation_id, request, response)


def metadata(correlation_id: int, topic: str = "events") -> Exchange:
    req_cls, resp_cls = (
        protocol.request_class(ApiKey.METADATA)[12],
        protocol.response_class(ApiKey.METADATA)[12],
    )
    request = encode_request(
        req_cls(topics=[req_cls.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False),
        correlation_id,
        "wire-test",
    )
    response = encode_response(
        resp_cls(throttle_time_ms=0, brokers=[], cluster_id="c", controller_id=1, topics=[]), correlation_id
    )
    return Exchange(ApiKey.METADATA, 12, correlation_id, request, response)


def produce(correlation_id: int, records: bytes, acks: int = 1, error_code: int = 0) -> Exchange:
    req_cls, resp_cls = protocol.request_class(ApiKey.PRODUCE)[9], protocol.response_class(ApiKey.PRODUCE)[9]
    data = req_cls.TopicProduceData
    request = encode_request(
        req_cls(
            transactional_id=None,
            acks=acks,
            timeout_ms=1000,
            topic_data=[
                data(name="events", partition_data=[data.PartitionProduceData(index=0, records=records)])
            ],
        ),
        correlation_id,
        "wire-test",
    )
    if acks == 0:
        return Exchange(ApiKey.PRODUCE, 9, correlation_id, request, None)
    topic = resp_cls.TopicProduceResponse
    response = encode_response(
        resp_cls(
            responses=[
                topic(
                    name="events",
                    partition_responses=[
                        topic.PartitionProduceResponse(
                            index=0,
                            error_code=error_code,
                            base_offset=0,
                            log_append_time_ms=-1,
                            log_start_offset=0,
                        )
                    ],
                )
            ],
            throttle_time_ms=0,
        ),
        correlation_id,
    )
    return Exchange(ApiKey.PRODUCE, 9, correlation_id, request, response)


def session(n_produce: int = 3, record_size: int = 2500) -> list[Exchange]:
    """A small client session: ApiVersions, Metadata, then Produce requests spanning several segments."""
    exchanges = [api_versions(1), metadata(2)]
    for i in range(n_produce):
        records = bytes((i + j) % 251 for j in range(record_size + 37 * i))
        exchanges.append(produce(3 + i, records))
    return exchanges
