"""Request header plausibility, exact body decoding, and the table of every request Kafka defines."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import (
    HEADER_IMPLAUSIBLE,
    HEADER_NEEDS_MORE,
    ApiKey,
    api_schemas,
    body_decodes_exactly,
    every_request_schema,
    parse_request_header,
    request_class,
    request_header_end,
    response_body_offset,
)
from protocol.testing import encode_request, random_message, request_seeds, response_seeds

SEEDS = [seed for seed in request_seeds() if int.from_bytes(seed.frame[8:12], "big", signed=True) >= 0]


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


# -- every request Kafka defines -------------------------------------------------------------


def test_every_api_key_has_a_schema_with_versions_from_0():
    schemas = every_request_schema()
    assert set(schemas) == {int(key) for key in ApiKey}
    assert all(schema.valid_versions[0] == 0 for schema in schemas.values())


def test_kafka_python_schemas_keep_their_highest_version_and_flexible_range():
    for key, schema in api_schemas().items():
        every = every_request_schema()[key]
        assert every.valid_versions == (0, schema.valid_versions[1])
        assert every.flexible_versions == schema.flexible_versions


@pytest.mark.parametrize(
    ("api_key", "highest", "first_flexible"),
    [
        (ApiKey.LEADER_AND_ISR, 7, 4),
        (ApiKey.STOP_REPLICA, 4, 2),
        (ApiKey.UPDATE_METADATA, 8, 6),
        (ApiKey.CONTROLLED_SHUTDOWN, 3, 3),
        (ApiKey.CREATE_DELEGATION_TOKEN, 3, 2),
        (ApiKey.SHARE_FETCH, 2, 0),
    ],
)
def test_keys_kafka_python_lacks(api_key, highest, first_flexible):
    schema = every_request_schema()[api_key]
    assert request_class(api_key) is None
    assert schema.valid_versions == (0, highest)
    assert not schema.is_flexible(first_flexible - 1) and schema.is_flexible(first_flexible)
    assert schema.name == "".join(part.title() for part in api_key.name.split("_"))


# -- plausible request headers ---------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"{s.api_key}v{s.api_version}")
def test_every_request_kafka_python_encodes_is_plausible(seed):
    end = request_header_end(seed.frame)
    assert end == parse_request_header(seed.frame).body_offset
    assert body_decodes_exactly(seed.api_key, seed.api_version, seed.frame[end:], request=True)


@pytest.mark.parametrize("seed", SEEDS[::7], ids=lambda s: f"{s.api_key}v{s.api_version}")
def test_a_header_cut_short_needs_more_never_implausible(seed):
    end = request_header_end(seed.frame)
    for cut in range(end):
        assert request_header_end(seed.frame[:cut]) == HEADER_NEEDS_MORE, cut


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (struct.pack(">hhi", 0, 14, 1) + b"\x00\x01c", "a version beyond every schema"),
        (struct.pack(">hhi", 93, 0, 1) + b"\x00\x01c", "an api key Kafka does not define"),
        (struct.pack(">hhi", 3, 1, -5) + b"\x00\x01c", "a negative correlation id"),
        (struct.pack(">hhi", 3, 1, 7) + b"\x00\x03a\x01b", "a control byte in the client id"),
        (struct.pack(">hhi", 3, 1, 7) + b"\x00\x02\xc3\x28", "a client id that is no UTF-8"),
        (struct.pack(">hhi", 3, 1, 7) + b"\x00\x40ab", "a client id longer than the frame"),
        (struct.pack(">hhi", 3, 1, 7) + b"\xff\xfe", "a client id length below -1"),
        (struct.pack(">hhi", 3, 12, 7) + b"\x00\x01c\x05\x01", "tagged fields past the frame's end"),
    ],
)
def test_implausible_headers(payload, why):
    assert request_header_end(frame(payload)) == HEADER_IMPLAUSIBLE, why


def test_sizes_out_of_range_are_implausible_at_once():
    assert request_header_end(struct.pack(">i", 7)) == HEADER_IMPLAUSIBLE
    assert request_header_end(struct.pack(">i", 100 * 2**20 + 1)) == HEADER_IMPLAUSIBLE
    assert request_header_end(struct.pack(">i", 40), max_frame_size=39) == HEADER_IMPLAUSIBLE
    assert request_header_end(struct.pack(">ih", 40, 999)) == HEADER_IMPLAUSIBLE


def test_controlled_shutdown_v0_has_no_client_id():
    assert (
        request_header_end(frame(struct.pack(">hhi", ApiKey.CONTROLLED_SHUTDOWN, 0, 3) + b"\x00" * 4)) == 12
    )


def test_retired_inter_broker_keys_are_plausible_at_every_version():
    for api_key in (ApiKey.LEADER_AND_ISR, ApiKey.STOP_REPLICA, ApiKey.UPDATE_METADATA):
        schema = every_request_schema()[api_key]
        for version in range(schema.valid_versions[1] + 1):
            head = struct.pack(">hhih", api_key, version, 1, 3) + b"abc"
            end = 4 + len(head) + (1 if schema.is_flexible(version) else 0)
            body = b"\x00" + b"\x01" * 10 if schema.is_flexible(version) else b"\x01" * 10
            assert request_header_end(frame(head + body)) == end, (api_key, version)


@settings(max_examples=300)
@given(data=st.binary(max_size=64))
def test_anything_is_decided_without_an_error(data):
    assert request_header_end(data) >= HEADER_IMPLAUSIBLE


# -- bodies decoded exactly --------------------------------------------------------------------


def test_a_body_one_byte_short_or_long_is_not_decoded():
    cls = request_class(ApiKey.PRODUCE)
    message = random_message(cls, 2, random.Random(3))
    request = encode_request(message, 9, "c")
    end = request_header_end(request)
    body = request[end:]
    assert body_decodes_exactly(ApiKey.PRODUCE, 2, body, request=True) is True
    assert body_decodes_exactly(ApiKey.PRODUCE, 2, body[:-1], request=True) is False
    assert body_decodes_exactly(ApiKey.PRODUCE, 2, body + b"\x00", request=True) is False


def test_answers_decode_at_their_request_version():
    for seed in response_seeds():
        body = seed.frame[response_body_offset(seed.frame, seed.api_key, seed.api_version) :]
        assert body_decodes_exactly(seed.api_key, seed.api_version, body, request=False)


def test_an_api_versions_answer_may_be_at_v0_whatever_was_asked():
    v0 = next(s for s in response_seeds() if s.api_key == ApiKey.API_VERSIONS and s.api_version == 0)
    assert body_decodes_exactly(ApiKey.API_VERSIONS, 3, v0.frame[8:], request=False)


def test_undecodable_apis_and_versions_are_neither_proven_nor_disproven():
    assert body_decodes_exactly(ApiKey.LEADER_AND_ISR, 0, b"", request=True) is None
    beyond = request_class(ApiKey.METADATA).max_version + 1
    assert body_decodes_exactly(ApiKey.METADATA, beyond, b"", request=True) is None
