"""The chaos policy, without sockets: frames in, decisions out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

import protocol
from corrfix.chaos import Action, ApiCounts, ChaosPolicy, ChaosRules, api_label, parse_api_key, parse_api_keys
from corrfix.chaos._policy import MAX_TRACKED_REQUESTS, SASL_TOKEN_API, UNKNOWN_API
from protocol import ApiKey
from protocol.testing import encode_request, encode_response


def produce_request(correlation_id: int, acks: int = 1, version: int = 9) -> bytes:
    cls = protocol.request_class(ApiKey.PRODUCE)
    return encode_request(
        cls[version](transactional_id=None, acks=acks, timeout_ms=1000, topic_data=[]), correlation_id
    )


def api_versions_request(correlation_id: int) -> bytes:
    return encode_request(ApiVersionsRequest[0](), correlation_id)


def response(correlation_id: int) -> bytes:
    return encode_response(ApiVersionsResponse[0](error_code=0, api_keys=[]), correlation_id)


def metadata_request(correlation_id: int) -> bytes:
    return encode_request(protocol.request_class(ApiKey.METADATA)[1](topics=None), correlation_id)


def broker_data(conn, data: bytes):
    """Each response frame the bytes complete, with its decision, as the relay takes them."""
    return [(frame, conn.response(frame)) for frame in conn.broker_frames(data)]


def exchange(conn, request: bytes, correlation_id: int):
    """One request and its response through a connection; returns the decision."""
    conn.client_data(request)
    [(frame, decision)] = broker_data(conn, response(correlation_id))
    assert bytes(frame) == response(correlation_id)
    return decision


# --- rules and parsing ----------------------------------------------------------------------


def test_rules_validate():
    with pytest.raises(ValueError):
        ChaosRules(drop_every=-1)
    with pytest.raises(ValueError):
        ChaosRules(drop_probability=1.5)
    with pytest.raises(ValueError):
        ChaosRules(delay_seconds=-1)
    assert not ChaosRules().active
    assert ChaosRules(kill_every=3).active
    assert ChaosRules(apis={1, 2}).apis == frozenset({1, 2})


@pytest.mark.parametrize(
    ("text", "key"),
    [("0", 0), ("Produce", 0), ("produce", 0), ("PRODUCE", 0), ("FetchRequest", 1), ("unknown", -1)],
)
def test_parse_api_key(text, key):
    assert parse_api_key(text) == key


def test_parse_api_keys_lists_and_errors():
    assert parse_api_keys(["Produce,fetch", "18"]) == {0, 1, 18}
    with pytest.raises(ValueError, match="unknown api"):
        parse_api_key("Produse")
    with pytest.raises(ValueError):
        parse_api_key("-5")


def test_api_label():
    assert api_label(0) == "Produce"
    assert api_label(UNKNOWN_API) == "unknown"
    assert api_label(SASL_TOKEN_API) == "sasl-token"


# --- matching responses to requests -----------------------------------------------------------


def test_no_rules_forwards_and_matches_api():
    policy = ChaosPolicy()
    conn = policy.connection("c1")
    decision = exchange(conn, api_versions_request(7), 7)
    assert decision.action is Action.FORWARD
    assert (decision.api_key, decision.api_version, decision.correlation_id) == (ApiKey.API_VERSIONS, 0, 7)
    assert not decision.kill
    assert policy.counts[ApiKey.API_VERSIONS].responses == 1
    assert policy.counts[ApiKey.API_VERSIONS].forwarded == 1
    assert conn.in_flight == 0


def test_requests_split_across_chunks_and_responses_out_of_order():
    policy = ChaosPolicy()
    conn = policy.connection()
    data = produce_request(1) + api_versions_request(2) + metadata_request(3)
    for i in range(0, len(data), 5):  # dribble the bytes in
        conn.client_data(data[i : i + 5])
    assert conn.in_flight == 3
    decided = broker_data(conn, response(3) + response(1) + response(2)[:6])
    assert [(d.correlation_id, d.api_key) for _, d in decided] == [(3, ApiKey.METADATA), (1, ApiKey.PRODUCE)]
    [(_, last)] = broker_data(conn, response(2)[6:])
    assert (last.correlation_id, last.api_key) == (2, ApiKey.API_VERSIONS)


@pytest.mark.parametrize("version", [0, 3, 8, 9, 11])
def test_produce_acks0_is_not_tracked_so_a_reply_is_a_stray(version):
    policy = ChaosPolicy(ChaosRules(drop_every=1, apis={ApiKey.PRODUCE}))
    conn = policy.connection()
    conn.client_data(produce_request(5, acks=0, version=version))
    assert conn.in_flight == 0
    [(_, decision)] = broker_data(conn, response(5))  # Tansu answers acks=0 anyway
    assert decision.api_key == UNKNOWN_API
    assert decision.action is Action.FORWARD  # the filter says Produce, a stray is "unknown"
    assert policy.counts[UNKNOWN_API].responses == 1


def test_acks1_produce_is_tracked():
    policy = ChaosPolicy()
    conn = policy.connection()
    assert exchange(conn, produce_request(5, acks=-1), 5).api_key == ApiKey.PRODUCE


def test_unknown_filter_targets_stray_replies():
    policy = ChaosPolicy(ChaosRules(drop_every=1, apis={UNKNOWN_API}))
    conn = policy.connection()
    assert exchange(conn, api_versions_request(1), 1).action is Action.FORWARD
    [(_, stray)] = broker_data(conn, response(99))
    assert (stray.api_key, stray.correlation_id, stray.action) == (UNKNOWN_API, 99, Action.DROP)


def test_garbage_raises_protocol_error():
    conn = ChaosPolicy().connection()
    with pytest.raises(protocol.ProtocolError):
        conn.client_data(b"\xff\xff\xff\xff")
    conn = ChaosPolicy().connection(max_frame_size=100)
    with pytest.raises(protocol.FrameSizeError):
        broker_data(conn, (1000).to_bytes(4, "big"))
    conn = ChaosPolicy().connection()
    with pytest.raises(protocol.ProtocolError):
        broker_data(conn, b"\x00\x00\x00\x01\x00")  # a response too short for a correlation id


def test_tracked_requests_are_bounded():
    policy = ChaosPolicy()
    conn = policy.connection()
    request = bytearray(api_versions_request(0))
    for correlation_id in range(MAX_TRACKED_REQUESTS + 10):
        protocol.patch_request_correlation_id(request, correlation_id)
        conn.request(request)
    assert conn.in_flight == MAX_TRACKED_REQUESTS
    assert conn.response(response(0)).api_key == UNKNOWN_API  # the oldest was forgotten
    assert conn.response(response(MAX_TRACKED_REQUESTS + 9)).api_key == ApiKey.API_VERSIONS
    conn.close()
    assert conn.in_flight == 0
    assert policy.connections_closed == 1


def test_sasl_handshake_v0_raw_tokens_pass_untouched():
    handshake = protocol.request_class(ApiKey.SASL_HANDSHAKE)
    policy = ChaosPolicy(ChaosRules(drop_every=1))  # drop everything that can be dropped
    conn = policy.connection()
    conn.client_data(encode_request(handshake[0](mechanism="PLAIN"), 1))
    ok = encode_response(
        protocol.response_class(ApiKey.SASL_HANDSHAKE)[0](error_code=0, mechanisms=["PLAIN"]), 1
    )
    [(_, decision)] = broker_data(conn, ok)
    assert decision.api_key == 17
    conn.client_data(protocol.frame(b"\x00user\x00secret"))  # a raw token, no Kafka header
    [(frame, token)] = broker_data(conn, protocol.frame(b""))  # its raw (empty) answer
    assert bytes(frame) == b"\x00\x00\x00\x00"
    assert (token.action, token.api_key) == (Action.FORWARD, SASL_TOKEN_API)
    # Authenticated: normal requests again.
    assert exchange(conn, api_versions_request(2), 2).api_key == ApiKey.API_VERSIONS
    assert policy.counts[SASL_TOKEN_API].forwarded == 1
    assert policy.total_responses == 2  # the token is not subject to chaos


def test_failed_sasl_handshake_v0_stays_in_kafka_mode():
    handshake = protocol.request_class(ApiKey.SASL_HANDSHAKE)
    conn = ChaosPolicy().connection()
    conn.client_data(encode_request(handshake[0](mechanism="NOPE"), 1))
    failed = encode_response(
        protocol.response_class(ApiKey.SASL_HANDSHAKE)[0](error_code=33, mechanisms=["PLAIN"]), 1
    )
    broker_data(conn, failed)
    with pytest.raises(protocol.ProtocolError):
        conn.client_data(protocol.frame(b"\x00u\x00p"))


# --- counting faults --------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    every=st.integers(min_value=1, max_value=12),
    apis=st.lists(st.sampled_from([ApiKey.PRODUCE, ApiKey.API_VERSIONS, ApiKey.METADATA]), max_size=40),
    connections=st.integers(min_value=1, max_value=4),
)
def test_drop_every_n_drops_floor_k_over_n_of_matching(every, apis, connections):
    policy = ChaosPolicy(ChaosRules(drop_every=every, apis={ApiKey.PRODUCE}))
    conns = [policy.connection() for _ in range(connections)]
    decisions = []
    for i, api in enumerate(apis):
        conn = conns[i % connections]  # interleaved connections share the count
        request = {
            ApiKey.PRODUCE: produce_request,
            ApiKey.API_VERSIONS: api_versions_request,
            ApiKey.METADATA: metadata_request,
        }
        decisions.append(exchange(conn, request[api](i), i))
    matching = [d for d in decisions if d.api_key == ApiKey.PRODUCE]
    dropped = [d for d in decisions if d.action is Action.DROP]
    assert len(dropped) == len(matching) // every
    assert all(d.api_key == ApiKey.PRODUCE for d in dropped)
    # Exactly the Nth, 2Nth, ... matching responses.
    assert [i + 1 for i, d in enumerate(matching) if d.action is Action.DROP] == list(
        range(every, len(matching) + 1, every)
    )
    assert policy.counts.get(ApiKey.PRODUCE, ApiCounts()).dropped == len(dropped)


def decisions_for(rules: ChaosRules, n: int, api: int = ApiKey.API_VERSIONS) -> list:
    policy = ChaosPolicy(rules)
    return [policy.decide(api, i) for i in range(n)]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32), p=st.floats(min_value=0.0, max_value=1.0))
def test_seeded_probability_is_reproducible(seed, p):
    rules = ChaosRules(drop_probability=p, duplicate_probability=p / 2, delay_probability=p / 3, seed=seed)
    first = decisions_for(rules, 200)
    assert first == decisions_for(rules, 200)
    if p == 0:
        assert all(d.action is Action.FORWARD for d in first)


def test_probability_rate_is_roughly_right():
    decisions = decisions_for(ChaosRules(drop_probability=0.1, seed=1), 5000)
    drops = sum(d.action is Action.DROP for d in decisions)
    assert 400 < drops < 600
    assert all(d.action is Action.DROP for d in decisions_for(ChaosRules(drop_probability=1.0), 50))


def test_unseeded_policy_records_its_seed_for_replay():
    policy = ChaosPolicy(ChaosRules(drop_probability=0.5))
    first = [policy.decide(0).action for _ in range(100)]
    replay = ChaosPolicy(ChaosRules(drop_probability=0.5, seed=policy.seed))
    assert first == [replay.decide(0).action for _ in range(100)]


def test_draws_do_not_depend_on_which_fault_wins():
    """Adding a counted drop must not shift the random duplicates of other responses."""
    base = decisions_for(ChaosRules(duplicate_probability=0.3, seed=42), 100)
    with_drops = decisions_for(ChaosRules(duplicate_probability=0.3, drop_every=4, seed=42), 100)
    for i, (a, b) in enumerate(zip(base, with_drops, strict=True)):
        assert b.action is (Action.DROP if (i + 1) % 4 == 0 else a.action)


def test_api_filter_respected_for_every_fault():
    rules = ChaosRules(drop_every=1, duplicate_every=1, delay_every=1, apis={ApiKey.FETCH})
    policy = ChaosPolicy(rules)
    assert policy.decide(ApiKey.PRODUCE).action is Action.FORWARD
    assert policy.decide(ApiKey.FETCH).action is Action.DROP  # drop beats duplicate and delay
    assert policy.matching_responses == 1


def test_precedence_and_independent_counts():
    rules = ChaosRules(drop_every=3, duplicate_every=2, delay_every=5, delay_seconds=0.25)
    actions = [d.action for d in decisions_for(rules, 10)]
    assert actions == [
        Action.FORWARD,  # 1
        Action.DUPLICATE,  # 2
        Action.DROP,  # 3
        Action.DUPLICATE,  # 4
        Action.DELAY,  # 5
        Action.DROP,  # 6: drop beats duplicate
        Action.FORWARD,  # 7
        Action.DUPLICATE,  # 8
        Action.DROP,  # 9
        Action.DUPLICATE,  # 10: duplicate beats delay
    ]
    delayed = [d for d in decisions_for(rules, 10) if d.action is Action.DELAY]
    assert [d.delay_seconds for d in delayed] == [0.25]


def test_kill_every_counts_all_responses_and_ignores_the_filter():
    policy = ChaosPolicy(ChaosRules(kill_every=3, drop_every=2, apis={ApiKey.PRODUCE}))
    decisions = [
        policy.decide(api)
        for api in [ApiKey.FETCH, ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.FETCH]
    ]
    assert [d.kill for d in decisions] == [False, False, True, False, False, True]
    assert [d.action for d in decisions][3] is Action.DROP  # 2nd Produce; kill is separate
    assert policy.counts[ApiKey.FETCH].kills == 2


def test_counts_and_summary():
    policy = ChaosPolicy(ChaosRules(drop_every=2, duplicate_every=3, seed=9))
    for _ in range(6):
        policy.decide(ApiKey.PRODUCE)
    policy.decide(UNKNOWN_API)
    produce = policy.counts[ApiKey.PRODUCE]
    assert (produce.responses, produce.forwarded, produce.dropped, produce.duplicated) == (6, 2, 3, 1)
    text = policy.summary()
    assert "seed 9" in text
    assert "Produce" in text
    assert "unknown" in text
    fields = policy.summary_fields()
    assert fields["responses"] == 7
    assert fields["per_api"]["Produce"]["dropped"] == 3
