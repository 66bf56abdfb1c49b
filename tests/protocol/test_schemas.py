"""API facts from kafka-python's bundled Apache Kafka schemas (protocol.schemas)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import api_name, api_schemas, every_request_schema, is_flexible, request_class, response_class
from protocol._schemas import ApiSchema

NO_FLEX = (-1, -1)
OPEN = 32767

# Apache Kafka facts: api key -> (name, first flexible version or None).
KNOWN = {
    0: ("Produce", 9),
    1: ("Fetch", 12),
    2: ("ListOffsets", 6),
    3: ("Metadata", 9),
    8: ("OffsetCommit", 8),
    9: ("OffsetFetch", 6),
    10: ("FindCoordinator", 3),
    11: ("JoinGroup", 6),
    12: ("Heartbeat", 4),
    13: ("LeaveGroup", 4),
    14: ("SyncGroup", 4),
    15: ("DescribeGroups", 5),
    16: ("ListGroups", 3),
    17: ("SaslHandshake", None),
    18: ("ApiVersions", 3),
    19: ("CreateTopics", 5),
    20: ("DeleteTopics", 4),
    21: ("DeleteRecords", 2),
    22: ("InitProducerId", 2),
    23: ("OffsetForLeaderEpoch", 4),
    24: ("AddPartitionsToTxn", 3),
    25: ("AddOffsetsToTxn", 3),
    26: ("EndTxn", 3),
    28: ("TxnOffsetCommit", 3),
    32: ("DescribeConfigs", 4),
    33: ("AlterConfigs", 2),
    36: ("SaslAuthenticate", 2),
    37: ("CreatePartitions", 2),
    42: ("DeleteGroups", 2),
    47: ("OffsetDelete", None),
    60: ("DescribeCluster", 0),
}

# Keys no Kafka release defined.
UNKNOWN_KEYS = [1000, 32767, -1]

# Keys kafka-python ships no schema for (inter-broker APIs, KRaft, KIP-848, share groups):
# api key -> (name, first flexible version or None), from Apache Kafka's JSON schemas.
KAFKA_ONLY = {
    4: ("LeaderAndIsr", 4),
    7: ("ControlledShutdown", 3),
    52: ("Vote", 0),
    68: ("ConsumerGroupHeartbeat", 0),
    76: ("ShareGroupHeartbeat", 0),
    88: ("StreamsGroupHeartbeat", 0),
}


@pytest.mark.parametrize(("api_key", "name", "first_flexible"), [(k, *v) for k, v in KNOWN.items()])
def test_known_apis_have_the_right_name_and_flexible_range(api_key, name, first_flexible):
    schema = api_schemas()[api_key]
    assert schema.api_key == api_key
    assert schema.name == name
    assert api_name(api_key) == name
    if first_flexible is None:
        assert schema.flexible_versions == NO_FLEX
        assert not any(is_flexible(api_key, v) for v in range(0, 40))
    else:
        assert schema.flexible_versions == (first_flexible, OPEN)
        if first_flexible > 0:
            assert is_flexible(api_key, first_flexible - 1) is False
        assert is_flexible(api_key, first_flexible) is True
        # versions newer than any the schema lists stay flexible
        assert is_flexible(api_key, schema.valid_versions[1] + 1) is True
        assert is_flexible(api_key, 1000) is True


def test_valid_versions_come_from_the_schema():
    low, high = api_schemas()[0].valid_versions
    assert 0 <= low <= 3 and high >= 9
    assert api_schemas()[18].valid_versions[1] >= 3
    for schema in api_schemas().values():
        low, high = schema.valid_versions
        assert 0 <= low <= high


def test_covers_the_common_client_apis():
    assert set(KNOWN) <= set(api_schemas())
    assert len(api_schemas()) >= 40


def test_api_schemas_is_cached():
    assert api_schemas() is api_schemas()


@pytest.mark.parametrize("api_key", UNKNOWN_KEYS)
def test_unknown_keys(api_key):
    assert api_key not in every_request_schema()
    assert api_name(api_key) == f"api_{api_key}"
    assert is_flexible(api_key, 0) is None
    assert request_class(api_key) is None
    assert response_class(api_key) is None


@pytest.mark.parametrize(("api_key", "name", "first_flexible"), [(k, *v) for k, v in KAFKA_ONLY.items()])
def test_keys_kafka_python_cannot_decode_still_have_their_name_and_flexible_range(
    api_key, name, first_flexible
):
    """Their bodies stay opaque, but their headers are read right: a KIP-848 consumer's
    heartbeats have flexible headers (a tag byte more in each), and logs and metrics name
    them rather than saying api_68."""
    assert api_key not in api_schemas()
    assert request_class(api_key) is None
    assert api_name(api_key) == name
    if first_flexible is None:
        assert is_flexible(api_key, 0) is False
        return
    if first_flexible > 0:
        assert is_flexible(api_key, first_flexible - 1) is False
    assert is_flexible(api_key, first_flexible) is True


@settings(max_examples=50)
@given(api_key=st.integers(-(2**15), 2**15 - 1))
def test_api_name_is_never_empty(api_key):
    name = api_name(api_key)
    assert name
    assert (api_key in every_request_schema()) == (name != f"api_{api_key}")


def test_not_flexible_never_matches_negative_versions():
    # (-1, -1) means "none"; it must not read as "flexible at version -1".
    schema = ApiSchema(api_key=17, name="SaslHandshake", valid_versions=(0, 1), flexible_versions=NO_FLEX)
    assert not schema.is_flexible(-1)
    assert not is_flexible(17, -1)


@settings(max_examples=50)
@given(low=st.integers(0, 20), version=st.integers(0, 100))
def test_api_schema_is_flexible_bounds(low, version):
    schema = ApiSchema(api_key=0, name="X", valid_versions=(0, 20), flexible_versions=(low, OPEN))
    assert schema.is_flexible(version) == (version >= low)


@pytest.mark.parametrize("api_key", sorted(api_schemas()))
def test_every_schema_has_matching_kafka_python_classes(api_key):
    schema = api_schemas()[api_key]
    request = request_class(api_key)
    response = response_class(api_key)
    assert request is not None and response is not None
    assert request.API_KEY == response.API_KEY == api_key
    assert request.is_request() and not response.is_request()
    assert request.name == schema.name + "Request"
    assert request.max_version == schema.valid_versions[1]
    for version in range(request.max_version + 2):
        assert request.flexible_version_q(version) == is_flexible(api_key, version)
        # response header versions are derived from the request schema: they must agree
        assert response.flexible_version_q(version) == is_flexible(api_key, version)
