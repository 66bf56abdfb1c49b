"""SASL through corrfix, against scripted brokers that authenticate the way Apache Kafka does.

- SaslHandshake v1 and SaslAuthenticate v0-v2 are ordinary requests: corrfix tracks them,
  rewrites their correlation ids and hands each answer back with the client's id.
- After a SaslHandshake v0, tokens travel as bare size-prefixed frames with no header.
  corrfix relays them byte for byte both ways, never injects a probe into the exchange (the
  broker would read it as a token), and tracks requests again once the mechanism's round
  trips are done: PLAIN one, SCRAM two. GSSAPI has no fixed count, so its connection stays
  a plain relay.
- Real clients (kafka-python, confluent-kafka) authenticate every connection they open
  through corrfix, with either handshake, and still reach every broker only through it.

The scripted broker (``tests/fake_cluster.py``) follows Kafka's SaslServerAuthenticator:
before authentication completes it accepts one ApiVersions, the handshake, then only
SaslAuthenticate (v1) or raw tokens (v0); anything else closes the connection.
"""

from __future__ import annotations

import confluent_kafka
import kafka
import pytest
import trio
from kafka.net.sasl.scram import ScramClient

from corrfix.core import PROBE_CLIENT_ID, RepairConfig
from protocol import ApiKey, request_class
from tests.support.cluster_harness import RawClient, Stack, in_thread, start_stack
from tests.support.fake_cluster import RawToken, Received, SaslSettings, gssapi_reply

USER, PASSWORD = "alice", "alice-secret"
TOPIC = "secured"
TEST_TIMEOUT = 60
CLIENT_TIMEOUT_MS = 10_000
PROBE = PROBE_CLIENT_ID.decode()
# Probes go out after 10-50 ms; the scripted authenticator takes 300 ms per step.
EAGER_PROBES = RepairConfig(probe_after=0.05, probe_min=0.01)
SLOW_AUTHENTICATOR = 0.3

ApiVersionsRequest = request_class(ApiKey.API_VERSIONS)
SaslHandshakeRequest = request_class(ApiKey.SASL_HANDSHAKE)
SaslAuthenticateRequest = request_class(ApiKey.SASL_AUTHENTICATE)
MetadataRequest = request_class(ApiKey.METADATA)


def plain_token(user: str = USER, password: str = PASSWORD) -> bytes:
    return f"{user}\0{user}\0{password}".encode()


def metadata_request(version: int = 12):
    return MetadataRequest(
        version=version,
        topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)],
        allow_auto_topic_creation=False,
    )


async def sasl_stack(
    nursery: trio.Nursery,
    *,
    handshake: int,
    delay: float = 0.0,
    repair: RepairConfig | None = None,
    nodes: tuple[int, ...] = (1,),
) -> Stack:
    sasl = SaslSettings(handshake_max_version=handshake, reply_delay=delay)
    return await start_stack(
        nursery, repair=repair, node_ids=nodes, topics={TOPIC: len(nodes)}, coordinator=nodes[0], sasl=sasl
    )


def only_connection(stack: Stack):
    (broker,) = stack.cluster.brokers.values()
    (connection,) = broker.connections
    return broker, connection


async def authenticate_v1(client: RawClient, mechanism: str, version: int) -> list:
    """SaslHandshake v1, then the mechanism's tokens in SaslAuthenticate ``version``."""
    handshake = await client.call(SaslHandshakeRequest(version=1, mechanism=mechanism))
    assert handshake.error_code == 0
    assert mechanism in handshake.mechanisms
    answers = []
    if mechanism == "PLAIN":
        answers.append(await client.call(SaslAuthenticateRequest(version=version, auth_bytes=plain_token())))
        assert answers[0].auth_bytes == b""
    else:
        scram = ScramClient(USER, PASSWORD, mechanism)
        first = await client.call(SaslAuthenticateRequest(version=version, auth_bytes=scram.first_message()))
        scram.process_server_first_message(first.auth_bytes)
        final = await client.call(SaslAuthenticateRequest(version=version, auth_bytes=scram.final_message()))
        scram.process_server_final_message(final.auth_bytes)  # checks the server's signature
        answers += [first, final]
    assert all(answer.error_code == 0 for answer in answers)
    return answers


# -- SaslHandshake v1 + SaslAuthenticate: ordinary, tracked requests ------------------------


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
@pytest.mark.parametrize("version", [0, 1, 2])
async def test_sasl_authenticate_is_tracked_with_ids_rewritten(mechanism, version):
    with trio.fail_after(TEST_TIMEOUT):
        async with trio.open_nursery() as nursery:
            stack = await sasl_stack(nursery, handshake=1)
            client = await RawClient.connect(stack.port, first_id=70_000)
            versions = await client.call(
                ApiVersionsRequest(version=3, client_software_name="raw", client_software_version="1")
            )
            ranges = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
            assert ranges[ApiKey.SASL_HANDSHAKE] == (0, 1)
            assert ranges[ApiKey.SASL_AUTHENTICATE] == (0, 2)
            await authenticate_v1(client, mechanism, version)
            metadata = await client.call(metadata_request())
            await client.aclose()
            await stack.settled()
            nursery.cancel_scope.cancel()
    broker, connection = only_connection(stack)
    assert connection.authenticated_as == USER
    assert broker.sasl_violations == []
    rounds = 1 if mechanism == "PLAIN" else 2
    expected_keys = (
        [ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE] + [ApiKey.SASL_AUTHENTICATE] * rounds + [ApiKey.METADATA]
    )
    requests = connection.requests
    assert [r.api_key for r in requests] == expected_keys
    assert all(r.api_version == version for r in requests if r.api_key == ApiKey.SASL_AUTHENTICATE)
    # The broker saw corrfix's own ids, 0, 1, 2, ...; the client got its ids (70000, 70007, ...)
    # back, which RawClient.call checked on every answer.
    assert [r.correlation_id for r in requests] == list(range(len(expected_keys)))
    assert client.next_id == 70_000 + 7 * len(expected_keys)
    # Tracking is on after authentication: the Metadata answer was rewritten to corrfix.
    assert [(b.node_id, b.host, b.port) for b in metadata.brokers] == [
        (1, "127.0.0.1", stack.router.listener_ports[1])
    ]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
async def test_no_probe_while_a_slow_sasl_v1_exchange_is_outstanding(mechanism):
    """A slow authenticator (an LDAP or OAuth callback, a KDC) answers after the probe timeout."""
    with trio.fail_after(TEST_TIMEOUT):
        async with trio.open_nursery() as nursery:
            stack = await sasl_stack(nursery, handshake=1, delay=SLOW_AUTHENTICATOR, repair=EAGER_PROBES)
            client = await RawClient.connect(stack.port)
            try:
                await authenticate_v1(client, mechanism, version=2)
                await client.call(metadata_request())
            finally:
                nursery.cancel_scope.cancel()
    broker, connection = only_connection(stack)
    assert broker.sasl_violations == []
    assert connection.authenticated_as == USER


# -- SaslHandshake v0: raw tokens -----------------------------------------------------------


async def exchange_v0(client: RawClient, mechanism: str) -> tuple[list[bytes], list[bytes]]:
    """SaslHandshake v0, then the raw tokens of ``mechanism``; returns (sent, received)."""
    handshake = await client.call(SaslHandshakeRequest(version=0, mechanism=mechanism))
    assert handshake.error_code == 0
    if mechanism == "PLAIN":
        sent = [plain_token()]
        received = [await client.exchange_token(sent[0])]
        assert received == [b""]  # Kafka's PLAIN server answers an empty token
        return sent, received
    scram = ScramClient(USER, PASSWORD, mechanism)
    sent = [scram.first_message()]
    received = [await client.exchange_token(sent[0])]
    scram.process_server_first_message(received[0])
    sent.append(scram.final_message())
    received.append(await client.exchange_token(sent[1]))
    scram.process_server_final_message(received[1])  # checks the server's signature
    return sent, received


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_sasl_v0_tokens_pass_untouched_without_probes_then_tracking_resumes(mechanism):
    with trio.fail_after(TEST_TIMEOUT):
        async with trio.open_nursery() as nursery:
            stack = await sasl_stack(nursery, handshake=0, delay=SLOW_AUTHENTICATOR, repair=EAGER_PROBES)
            # What the broker advertises, on a connection of its own (Kafka accepts one
            # ApiVersions before the handshake, and a probe would be a second one).
            probe = await RawClient.connect(stack.port)
            versions = await probe.call(ApiVersionsRequest(version=0))
            await probe.aclose()
            ranges = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
            assert ranges[ApiKey.SASL_HANDSHAKE] == (0, 0)
            assert ApiKey.SASL_AUTHENTICATE not in ranges

            client = await RawClient.connect(stack.port, first_id=500)
            sent, received = await exchange_v0(client, mechanism)
            # Pipelined after the exchange: tracked again, ids rewritten, answers in order.
            metadata_id = await client.send(metadata_request())
            versions_id = await client.send(ApiVersionsRequest(version=0))
            metadata = await client.receive_answer(metadata_request(), metadata_id)
            again = await client.receive_answer(ApiVersionsRequest(version=0), versions_id)
            await client.aclose()
            await stack.settled()
            nursery.cancel_scope.cancel()
    broker = stack.cluster.brokers[1]
    assert broker.sasl_violations == []
    first, connection = broker.connections
    assert [r.api_key for r in first.requests] == [ApiKey.API_VERSIONS]
    assert connection.authenticated_as == USER
    # Byte for byte, both ways.
    assert connection.raw_tokens == sent
    assert connection.raw_replies == received
    # Everything the broker received on the connection, in order: no probe anywhere in the
    # handshake or the exchange, though every step took longer than the probe timeout.
    items = connection.received
    assert [type(item) for item in items] == [Received] + [RawToken] * len(sent) + [Received, Received]
    assert not any(isinstance(i, Received) and i.client_id == PROBE for i in items[: 1 + len(sent)])
    handshake, *_, after_metadata, after_versions = items
    assert (handshake.api_key, handshake.api_version, handshake.correlation_id) == (
        ApiKey.SASL_HANDSHAKE,
        0,
        0,
    )
    assert (after_metadata.api_key, after_metadata.correlation_id) == (ApiKey.METADATA, 1)
    assert (after_versions.api_key, after_versions.correlation_id) == (ApiKey.API_VERSIONS, 2)
    assert (metadata_id, versions_id) == (507, 514)  # the ids the client got back
    assert [(b.node_id, b.port) for b in metadata.brokers] == [(1, stack.router.listener_ports[1])]
    assert again.error_code == 0
    assert "probe_sent" not in stack.proxy.stats.repairs


async def test_sasl_v0_gssapi_stays_a_plain_relay():
    """GSSAPI has no fixed number of round trips, so corrfix stops tracking for good:
    every byte afterwards passes untouched, client ids included, and no probe is sent."""
    tokens = [b"\x60\x82gss-initial-context", b"gss-second", b"gss-wrap"]
    with trio.fail_after(TEST_TIMEOUT):
        async with trio.open_nursery() as nursery:
            stack = await sasl_stack(nursery, handshake=0, delay=SLOW_AUTHENTICATOR, repair=EAGER_PROBES)
            client = await RawClient.connect(stack.port, first_id=4242)
            handshake = await client.call(SaslHandshakeRequest(version=0, mechanism="GSSAPI"))
            assert handshake.error_code == 0
            replies = [await client.exchange_token(token) for token in tokens]
            versions_id = await client.send(ApiVersionsRequest(version=0))
            raw_answer = await client.receive_frame()
            await client.aclose()
            await stack.settled()
            nursery.cancel_scope.cancel()
    broker, connection = only_connection(stack)
    assert replies == [gssapi_reply(i, token) for i, token in enumerate(tokens, start=1)]
    assert connection.raw_tokens == tokens
    assert connection.raw_replies == replies
    assert connection.authenticated_as == "gssapi-principal"
    handshake_seen, *_, after = connection.received
    assert handshake_seen.correlation_id == 0  # tracked: corrfix's id
    # After the exchange: the client's own id reached the broker (no rewriting) ...
    assert (after.api_key, after.correlation_id, after.client_id) == (
        ApiKey.API_VERSIONS,
        versions_id,
        "raw-client",
    )
    # ... and the broker's answer came back as it was sent, with that id.
    assert int.from_bytes(raw_answer[4:8], "big") == versions_id == 4249
    assert broker.sasl_violations == []
    assert "probe_sent" not in stack.proxy.stats.repairs


# -- real clients, three brokers ------------------------------------------------------------


def produce_kafka_python_sasl(bootstrap: str, mechanism: str, partitions: int) -> None:
    producer = kafka.KafkaProducer(
        bootstrap_servers=bootstrap,
        client_id="sasl-kafka-python",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism=mechanism,
        sasl_plain_username=USER,
        sasl_plain_password=PASSWORD,
        acks=1,
        enable_idempotence=False,
        request_timeout_ms=CLIENT_TIMEOUT_MS,
        max_block_ms=CLIENT_TIMEOUT_MS,
        bootstrap_timeout_ms=CLIENT_TIMEOUT_MS,
    )
    try:
        futures = [producer.send(TOPIC, b"kp-%d" % p, partition=p) for p in range(partitions)]
        for future in futures:
            future.get(timeout=CLIENT_TIMEOUT_MS / 1000)
    finally:
        producer.close(timeout=5)


def produce_confluent_sasl(bootstrap: str, mechanism: str, partitions: int) -> list[str]:
    errors: list[str] = []
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "sasl-confluent",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.username": USER,
            "sasl.password": PASSWORD,
            "acks": "1",
            "enable.idempotence": False,
            "message.timeout.ms": CLIENT_TIMEOUT_MS,
        }
    )

    def on_delivery(err, msg) -> None:
        if err is not None:
            errors.append(f"{msg.partition()}: {err}")

    for p in range(partitions):
        producer.produce(TOPIC, b"ck-%d" % p, partition=p, on_delivery=on_delivery)
    if producer.flush(CLIENT_TIMEOUT_MS / 1000):
        errors.append("messages still queued")
    producer.close()
    return errors


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
@pytest.mark.parametrize("handshake", [0, 1])
@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
async def test_real_clients_authenticate_every_connection_through_corrfix(client, handshake, mechanism):
    nodes = (1, 2, 3)
    with trio.fail_after(TEST_TIMEOUT):
        async with trio.open_nursery() as nursery:
            stack = await sasl_stack(nursery, handshake=handshake, nodes=nodes)
            if client == "kafka-python":
                await in_thread(produce_kafka_python_sasl, stack.bootstrap, mechanism, len(nodes))
            else:
                assert await in_thread(produce_confluent_sasl, stack.bootstrap, mechanism, len(nodes)) == []
            await stack.assert_clients_stayed_on_proxy()
            nursery.cancel_scope.cancel()
    prefix = b"kp" if client == "kafka-python" else b"ck"
    for node_id, broker in stack.cluster.brokers.items():
        partition = nodes.index(node_id)
        assert broker.logs == {(TOPIC, partition): [b"%s-%d" % (prefix, partition)]}
        assert broker.sasl_violations == []
        for connection in broker.connections:
            assert connection.authenticated_as == USER
            handshakes = [r.api_version for r in connection.requests if r.api_key == ApiKey.SASL_HANDSHAKE]
            assert handshakes == [handshake]
            if handshake == 0:
                assert len(connection.raw_tokens) == (1 if mechanism == "PLAIN" else 2)
            else:
                assert connection.raw_tokens == []
