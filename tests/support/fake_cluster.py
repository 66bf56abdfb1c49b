"""A scripted Kafka cluster of several in-process brokers, for what Tansu (one node) cannot show.

Each broker is a trio server on its own loopback port with its own node id. Every answer is
a real body encoded by kafka-python from Apache Kafka's schemas, so real clients (kafka-python,
confluent-kafka) can bootstrap, learn the cluster and produce:

- ApiVersions: the version ranges a real Kafka 4.1 broker advertises (from kafka-python's
  table), for the APIs served here plus Fetch and ListOffsets, which clients read to pick
  features (librdkafka needs Fetch v4 before it writes record batches v2);
- Metadata: the brokers' *real* addresses, topic partitions led by different brokers;
- FindCoordinator v0-3 (one key) and v4+ (batched keys): the coordinator is one broker;
  the key :data:`UNAVAILABLE_KEY` gets COORDINATOR_NOT_AVAILABLE with the placeholder
  address (node -1, empty host, port -1) that clients ignore;
- DescribeCluster; OffsetFetch (no committed offsets) at the coordinator;
- Produce: per partition, appended and acknowledged when this broker leads it, else
  NOT_LEADER_OR_FOLLOWER, with the KIP-951 leader hint and ``node_endpoints`` (real
  address) from v10 on. acks=0 gets no answer;
- SASL (optional): SaslHandshake v0 (tokens then travel as bare size-prefixed frames) or
  v1 with SaslAuthenticate, for PLAIN, SCRAM-SHA-256/512 (a real server side, so real
  clients verify it) and a scripted GSSAPI with a fixed number of rounds. Until a
  connection has authenticated it follows Apache Kafka's ``SaslServerAuthenticator``: one
  ApiVersions, at most, then SaslHandshake, then only SaslAuthenticate (v1) or raw tokens
  (v0). Anything else, a second ApiVersions included, is a SASL violation: it is recorded
  and the connection closed, as Kafka closes it (IllegalSaslStateException).

Anything else is recorded in ``unhandled`` and closes the connection, so a test sees at once
that a client asked for something the script does not know. Every broker records each
connection it accepted (the peer address) and everything it received on it, in order: parsed
request headers and raw SASL tokens, plus the raw token replies it sent.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import trio
from kafka.protocol.broker_version_data import BROKER_API_VERSIONS
from kafka.record import MemoryRecords

from protocol import (
    ApiKey,
    FrameDecoder,
    frame,
    parse_request_header,
    produce_acks,
    request_class,
    response_class,
)
from protocol.testing import encode_response
from tests.support.changes import Changes

LOOPBACK = "127.0.0.1"
CLUSTER_ID = "corrfix-fake-cluster"
REAL_BROKER_VERSION = (4, 1)
UNAVAILABLE_KEY = "no-coordinator"

SERVED = frozenset(
    {
        ApiKey.PRODUCE,
        ApiKey.METADATA,
        ApiKey.OFFSET_FETCH,
        ApiKey.FIND_COORDINATOR,
        ApiKey.SASL_HANDSHAKE,
        ApiKey.API_VERSIONS,
    }
)
SERVED |= {ApiKey.SASL_AUTHENTICATE, ApiKey.DESCRIBE_CLUSTER}
ADVERTISED_ONLY = frozenset({ApiKey.FETCH, ApiKey.LIST_OFFSETS})

NO_ERROR = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
NOT_LEADER_OR_FOLLOWER = 6
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
UNSUPPORTED_SASL_MECHANISM = 33
SASL_AUTHENTICATION_FAILED = 58


# -- what a broker saw --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Received:
    """A request header as the broker received it (so with the proxy's correlation id)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


@dataclass(frozen=True, slots=True)
class RawToken:
    """A SASL token received after SaslHandshake v0: a bare frame, no header."""

    data: bytes


@dataclass
class ConnectionLog:
    peer: str
    received: list[Received | RawToken] = field(default_factory=list)
    raw_replies: list[bytes] = field(default_factory=list)
    authenticated_as: str | None = None
    closed_by_broker: str | None = None

    @property
    def requests(self) -> list[Received]:
        return [item for item in self.received if isinstance(item, Received)]

    @property
    def raw_tokens(self) -> list[bytes]:
        return [item.data for item in self.received if isinstance(item, RawToken)]


# -- SASL server side -----------------------------------------------------------------------


class AuthenticationFailedError(Exception):
    pass


class _Plain:
    rounds = 1

    def __init__(self, users: dict[str, str]) -> None:
        self.users = users
        self.done = False
        self.user: str | None = None

    def step(self, token: bytes) -> bytes:
        try:
            _authzid, user, password = token.decode().split("\0")
        except ValueError as exc:
            raise AuthenticationFailedError("malformed PLAIN token") from exc
        if self.users.get(user) != password:
            raise AuthenticationFailedError(f"bad password for {user!r}")
        self.done, self.user = True, user
        return b""


class _Scram:
    """The server side of RFC 5802 (no channel binding), as Kafka's SCRAM-SHA-256/512."""

    rounds = 2
    ITERATIONS = 4096

    def __init__(self, users: dict[str, str], mechanism: str) -> None:
        self.users = users
        self.hash = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}[mechanism]
        self.done = False
        self.user: str | None = None
        self._first_bare = b""
        self._server_first = b""
        self._nonce = b""
        self._salted = b""

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self.hash).digest()

    def step(self, token: bytes) -> bytes:
        if not self._server_first:
            if not token.startswith(b"n,,"):
                raise AuthenticationFailedError("unexpected SCRAM client-first message")
            self._first_bare = token[3:]
            params = dict(item.split(b"=", 1) for item in self._first_bare.split(b","))
            self.user = params[b"n"].decode()
            if self.user not in self.users:
                raise AuthenticationFailedError(f"unknown user {self.user!r}")
            salt = hashlib.sha256(self.user.encode()).digest()[:16]
            self._salted = hashlib.pbkdf2_hmac(
                self.hash().name, self.users[self.user].encode(), salt, self.ITERATIONS
            )
            self._nonce = params[b"r"] + base64.b64encode(os.urandom(12)).rstrip(b"=")
            self._server_first = (
                b"r=" + self._nonce + b",s=" + base64.b64encode(salt) + b",i=%d" % self.ITERATIONS
            )
            return self._server_first
        without_proof, _, proof = token.rpartition(b",p=")
        params = dict(item.split(b"=", 1) for item in without_proof.split(b","))
        if params.get(b"r") != self._nonce:
            raise AuthenticationFailedError("SCRAM nonce mismatch")
        auth_message = self._first_bare + b"," + self._server_first + b"," + without_proof
        client_key = self._hmac(self._salted, b"Client Key")
        signature = self._hmac(self.hash(client_key).digest(), auth_message)
        expected = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        if base64.b64decode(proof) != expected:
            raise AuthenticationFailedError("SCRAM proof mismatch")
        self.done = True
        server_signature = self._hmac(self._hmac(self._salted, b"Server Key"), auth_message)
        return b"v=" + base64.b64encode(server_signature)


class _ScriptedGssapi:
    """Not Kerberos: a fixed number of rounds whose replies a test can predict."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds
        self.done = False
        self.user: str | None = None
        self._round = 0

    def step(self, token: bytes) -> bytes:
        self._round += 1
        if self._round >= self.rounds:
            self.done, self.user = True, "gssapi-principal"
        return gssapi_reply(self._round, token)


def gssapi_reply(round_number: int, token: bytes) -> bytes:
    """What the scripted GSSAPI server answers to the token of round ``round_number`` (from 1)."""
    return b"gss-%d:" % round_number + token[::-1]


@dataclass(frozen=True)
class SaslSettings:
    """SASL on every broker of the cluster."""

    handshake_max_version: int = 1
    """0: tokens travel raw after the handshake (and SaslAuthenticate is not advertised)."""
    users: dict[str, str] = field(default_factory=lambda: {"alice": "alice-secret"})
    mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI")
    gssapi_rounds: int = 3
    reply_delay: float = 0.0
    """Seconds the broker takes to answer a SaslHandshake and each SASL token."""

    def mechanism(self, name: str) -> _Plain | _Scram | _ScriptedGssapi:
        if name == "PLAIN":
            return _Plain(self.users)
        if name.startswith("SCRAM-"):
            return _Scram(self.users, name)
        return _ScriptedGssapi(self.gssapi_rounds)


# -- the cluster ----------------------------------------------------------------------------


class _Close(Exception):
    """The broker closes the connection (an unknown request, a SASL violation)."""


# SASL stages of a connection, after Kafka's SaslServerAuthenticator states.
VERSIONS_OR_HANDSHAKE = "versions-or-handshake"  # HANDSHAKE_OR_VERSIONS_REQUEST
HANDSHAKE = "handshake"  # HANDSHAKE_REQUEST: an ApiVersions was answered
AUTHENTICATE = "authenticate"  # SaslHandshake v1 succeeded: only SaslAuthenticate now
RAW = "raw"  # SaslHandshake v0 succeeded: bare tokens now
COMPLETE = "complete"


@dataclass
class _ConnectionState:
    log: ConnectionLog
    stage: str
    mechanism: Any = None
    close_after_answer: str | None = None


class ClusterBroker:
    """One node of a :class:`FakeCluster`."""

    def __init__(self, cluster: FakeCluster, node_id: int) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.port = 0
        self.listener: trio.SocketListener | None = None
        self._serving = trio.CancelScope()
        self.connections: list[ConnectionLog] = []
        self.logs: dict[tuple[str, int], list[bytes]] = {}
        """Values appended per (topic, partition) this broker leads."""
        self.misdirected: list[tuple[str, int]] = []
        """Produce partitions this broker answered NOT_LEADER_OR_FOLLOWER for."""
        self.unhandled: list[Received] = []
        self.sasl_violations: list[tuple[str, Received]] = []
        """(SASL stage, request) of each request Kafka would have failed the connection for."""
        self._handlers: dict[int, Callable[[Any, Received, _ConnectionState], Any]] = {
            ApiKey.PRODUCE: self._produce,
            ApiKey.METADATA: self._metadata,
            ApiKey.OFFSET_FETCH: self._offset_fetch,
            ApiKey.FIND_COORDINATOR: self._find_coordinator,
            ApiKey.SASL_HANDSHAKE: self._sasl_handshake,
            ApiKey.API_VERSIONS: self._api_versions,
            ApiKey.SASL_AUTHENTICATE: self._sasl_authenticate,
            ApiKey.DESCRIBE_CLUSTER: self._describe_cluster,
        }

    # -- what tests read ----------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def accepted(self) -> int:
        return len(self.connections)

    @property
    def peers(self) -> list[str]:
        return [connection.peer for connection in self.connections]

    @property
    def requests(self) -> list[Received]:
        return [request for connection in self.connections for request in connection.requests]

    def api_counts(self) -> Counter[int]:
        return Counter(request.api_key for request in self.requests)

    def produced_values(self) -> list[bytes]:
        return [value for values in self.logs.values() for value in values]

    # -- serving --------------------------------------------------------------------------

    async def bind(self) -> None:
        """Listen on ``self.port`` (a free one the first time; the same one after a crash)."""
        (self.listener,) = await trio.open_tcp_listeners(self.port, host=LOOPBACK)
        self.port = self.listener.socket.getsockname()[1]

    async def serve(self) -> None:
        assert self.listener is not None
        with trio.CancelScope() as self._serving:
            await trio.serve_listeners(self._handle, [self.listener])

    def crash(self) -> None:
        """Stop listening and drop every connection at once, as a dying broker process does.

        ``logs`` survive, as a broker's durable log does; :meth:`restart` brings it back.
        """
        self._serving.cancel()

    async def restart(self, nursery: trio.Nursery) -> None:
        await self.bind()
        nursery.start_soon(self.serve)

    async def _handle(self, stream: trio.SocketStream) -> None:
        host, port, *_ = stream.socket.getpeername()
        log = ConnectionLog(f"{host}:{port}")
        self.connections.append(log)
        self.cluster.changes.notify()
        try:
            await self._converse(stream, log)
        finally:
            self.cluster.changes.notify()

    async def _converse(self, stream: trio.SocketStream, log: ConnectionLog) -> None:
        state = _ConnectionState(log, COMPLETE if self.cluster.sasl is None else VERSIONS_OR_HANDSHAKE)
        decoder = FrameDecoder()
        async with stream:
            while True:
                try:
                    data = await stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not data:
                    return
                for request in decoder.feed(data):
                    try:
                        answer = await self._answer(request, state)
                    except _Close as close:
                        log.closed_by_broker = str(close)
                        return
                    try:
                        if answer is not None:
                            await stream.send_all(answer)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        return
                    if state.close_after_answer is not None:
                        log.closed_by_broker = state.close_after_answer
                        return

    async def _answer(self, request: bytearray, state: _ConnectionState) -> bytes | None:
        log = state.log
        if state.stage == RAW:
            token = bytes(request[4:])
            log.received.append(RawToken(token))
            try:
                reply = state.mechanism.step(token)
            except AuthenticationFailedError as exc:
                raise _Close(f"SASL authentication failed: {exc}") from exc
            await self._sasl_delay()
            log.raw_replies.append(reply)
            if state.mechanism.done:
                self._authenticated(state)
            return frame(reply)
        header = parse_request_header(request)
        received = Received(header.api_key, header.api_version, header.correlation_id, header.client_id)
        log.received.append(received)
        if not self._allowed(header.api_key, state):
            self.sasl_violations.append((state.stage, received))
            raise _Close(f"{received} in SASL stage {state.stage}")
        handler = self._handlers.get(header.api_key)
        low, high = self.cluster.api_ranges.get(header.api_key, (0, -1))
        if handler is None or not low <= header.api_version <= high or header.body_offset is None:
            self.unhandled.append(received)
            raise _Close(f"unhandled {received}")
        cls = request_class(header.api_key)
        assert cls is not None
        body = cls.decode(bytes(request[header.body_offset :]), version=header.api_version)
        if header.api_key == ApiKey.PRODUCE and produce_acks(request, header) == 0:
            handler(body, received, state)
            return None
        message = handler(body, received, state)
        if header.api_key in (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
            await self._sasl_delay()
        return encode_response(message, header.correlation_id)

    @staticmethod
    def _allowed(api_key: int, state: _ConnectionState) -> bool:
        """What Kafka's SaslServerAuthenticator accepts in each stage."""
        stage = state.stage
        if stage == COMPLETE:
            return api_key != ApiKey.SASL_AUTHENTICATE  # re-authentication is not scripted
        if stage == VERSIONS_OR_HANDSHAKE:
            return api_key in (ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE)
        if stage == HANDSHAKE:
            return api_key == ApiKey.SASL_HANDSHAKE
        return stage == AUTHENTICATE and api_key == ApiKey.SASL_AUTHENTICATE

    def _authenticated(self, state: _ConnectionState) -> None:
        state.stage = COMPLETE
        state.log.authenticated_as = state.mechanism.user

    def _response(self, api_key: int, version: int, **fields: Any) -> Any:
        cls = response_class(api_key)
        assert cls is not None
        return cls(version=version, **fields)

    # -- APIs ---------------------------------------------------------------------------

    def _api_versions(self, _request: Any, received: Received, state: _ConnectionState) -> Any:
        if state.stage == VERSIONS_OR_HANDSHAKE:
            state.stage = HANDSHAKE
        cls = response_class(ApiKey.API_VERSIONS)
        assert cls is not None
        keys = [
            cls.ApiVersion(api_key=key, min_version=low, max_version=high)
            for key, (low, high) in sorted(self.cluster.api_ranges.items())
        ]
        return self._response(ApiKey.API_VERSIONS, received.api_version, error_code=NO_ERROR, api_keys=keys)

    def _metadata(self, request: Any, received: Received, _state: _ConnectionState) -> Any:
        cls = response_class(ApiKey.METADATA)
        assert cls is not None
        cluster = self.cluster
        version = received.api_version
        wanted: Iterable[str]
        if request.topics is None or (version == 0 and not request.topics):
            wanted = cluster.topics
        else:
            wanted = [
                topic.name if topic.name is not None else cluster.topic_names.get(topic.topic_id, "")
                for topic in request.topics
            ]
        topic_cls = cls.MetadataResponseTopic
        partition_cls = topic_cls.MetadataResponsePartition
        topics = []
        for name in wanted:
            if name not in cluster.topics:
                topics.append(topic_cls(error_code=UNKNOWN_TOPIC_OR_PARTITION, name=name, partitions=[]))
                continue
            partitions = [
                partition_cls(
                    error_code=NO_ERROR,
                    partition_index=index,
                    leader_id=cluster.leader(name, index),
                    leader_epoch=0,
                    replica_nodes=[cluster.leader(name, index)],
                    isr_nodes=[cluster.leader(name, index)],
                    offline_replicas=[],
                )
                for index in range(cluster.topics[name])
            ]
            topic_id = cluster.topic_ids[name]
            topics.append(
                topic_cls(
                    error_code=NO_ERROR,
                    name=name,
                    topic_id=topic_id,
                    is_internal=False,
                    partitions=partitions,
                )
            )
        brokers = [
            cls.MetadataResponseBroker(node_id=node_id, host=LOOPBACK, port=broker.port, rack=None)
            for node_id, broker in cluster.brokers.items()
        ]
        return self._response(
            ApiKey.METADATA,
            version,
            throttle_time_ms=0,
            brokers=brokers,
            cluster_id=CLUSTER_ID,
            controller_id=cluster.controller,
            topics=topics,
            error_code=NO_ERROR,
        )

    def _find_coordinator(self, request: Any, received: Received, _state: _ConnectionState) -> Any:
        coordinator = self.cluster.brokers[self.cluster.coordinator]

        def entry(key: str) -> dict[str, Any]:
            if key == UNAVAILABLE_KEY:
                return {
                    "error_code": COORDINATOR_NOT_AVAILABLE,
                    "error_message": "scripted: no coordinator",
                    "node_id": -1,
                    "host": "",
                    "port": -1,
                }
            return {
                "error_code": NO_ERROR,
                "error_message": None,
                "node_id": coordinator.node_id,
                "host": LOOPBACK,
                "port": coordinator.port,
            }

        version = received.api_version
        if version <= 3:
            return self._response(ApiKey.FIND_COORDINATOR, version, throttle_time_ms=0, **entry(request.key))
        cls = response_class(ApiKey.FIND_COORDINATOR)
        assert cls is not None
        coordinators = [cls.Coordinator(key=key, **entry(key)) for key in request.coordinator_keys]
        return self._response(ApiKey.FIND_COORDINATOR, version, throttle_time_ms=0, coordinators=coordinators)

    def _describe_cluster(self, _request: Any, received: Received, _state: _ConnectionState) -> Any:
        cls = response_class(ApiKey.DESCRIBE_CLUSTER)
        assert cls is not None
        brokers = [
            cls.DescribeClusterBroker(
                broker_id=node_id, host=LOOPBACK, port=broker.port, rack=None, is_fenced=False
            )
            for node_id, broker in self.cluster.brokers.items()
        ]
        return self._response(
            ApiKey.DESCRIBE_CLUSTER,
            received.api_version,
            throttle_time_ms=0,
            error_code=NO_ERROR,
            error_message=None,
            endpoint_type=1,
            cluster_id=CLUSTER_ID,
            controller_id=self.cluster.controller,
            brokers=brokers,
        )

    def _offset_fetch(self, request: Any, received: Received, _state: _ConnectionState) -> Any:
        """No offsets are ever committed here; only the coordinator answers without error."""
        error = NO_ERROR if self.node_id == self.cluster.coordinator else NOT_COORDINATOR
        version = received.api_version
        if version <= 7:
            return self._response(
                ApiKey.OFFSET_FETCH, version, throttle_time_ms=0, topics=[], error_code=error
            )
        cls = response_class(ApiKey.OFFSET_FETCH)
        assert cls is not None
        groups = [
            cls.OffsetFetchResponseGroup(group_id=group.group_id, topics=[], error_code=error)
            for group in request.groups
        ]
        return self._response(ApiKey.OFFSET_FETCH, version, throttle_time_ms=0, groups=groups)

    def _produce(self, request: Any, received: Received, _state: _ConnectionState) -> Any:
        cls = response_class(ApiKey.PRODUCE)
        assert cls is not None
        topic_cls = cls.TopicProduceResponse
        partition_cls = topic_cls.PartitionProduceResponse
        cluster = self.cluster
        version = received.api_version
        leaders_named: set[int] = set()
        responses = []
        for topic in request.topic_data:
            name = topic.name if version <= 12 else cluster.topic_names.get(topic.topic_id, "")
            partitions = []
            for data in topic.partition_data:
                fields: dict[str, Any] = {"index": data.index, "base_offset": -1, "log_start_offset": -1}
                leader = cluster.leader(name, data.index) if name in cluster.topics else None
                if leader is None or data.index >= cluster.topics[name]:
                    fields["error_code"] = UNKNOWN_TOPIC_OR_PARTITION
                elif leader != self.node_id:
                    self.misdirected.append((name, data.index))
                    fields["error_code"] = NOT_LEADER_OR_FOLLOWER
                    fields["current_leader"] = partition_cls.LeaderIdAndEpoch(
                        leader_id=leader, leader_epoch=0
                    )
                    leaders_named.add(leader)
                else:
                    log = self.logs.setdefault((name, data.index), [])
                    fields.update(error_code=NO_ERROR, base_offset=len(log), log_start_offset=0)
                    log.extend(record_values(data.records))
                partitions.append(
                    partition_cls(log_append_time_ms=-1, record_errors=[], error_message=None, **fields)
                )
            responses.append(topic_cls(name=name, topic_id=topic.topic_id, partition_responses=partitions))
        endpoints = [
            cls.NodeEndpoint(node_id=node_id, host=LOOPBACK, port=cluster.brokers[node_id].port, rack=None)
            for node_id in sorted(leaders_named)
        ]
        return self._response(
            ApiKey.PRODUCE, version, responses=responses, throttle_time_ms=0, node_endpoints=endpoints
        )

    # -- SASL -----------------------------------------------------------------------------

    def _sasl_handshake(self, request: Any, received: Received, state: _ConnectionState) -> Any:
        sasl = self.cluster.sasl
        enabled = list(sasl.mechanisms) if sasl is not None else []
        if sasl is None or request.mechanism not in enabled:
            if sasl is not None:
                state.close_after_answer = f"unsupported SASL mechanism {request.mechanism!r}"
            return self._response(
                ApiKey.SASL_HANDSHAKE,
                received.api_version,
                error_code=UNSUPPORTED_SASL_MECHANISM,
                mechanisms=enabled,
            )
        state.mechanism = sasl.mechanism(request.mechanism)
        state.stage = RAW if received.api_version == 0 else AUTHENTICATE
        return self._response(
            ApiKey.SASL_HANDSHAKE, received.api_version, error_code=NO_ERROR, mechanisms=enabled
        )

    def _sasl_authenticate(self, request: Any, received: Received, state: _ConnectionState) -> Any:
        version = received.api_version
        mechanism = state.mechanism
        try:
            reply = mechanism.step(bytes(request.auth_bytes))
        except AuthenticationFailedError as exc:
            state.close_after_answer = f"SASL authentication failed: {exc}"
            return self._response(
                ApiKey.SASL_AUTHENTICATE,
                version,
                error_code=SASL_AUTHENTICATION_FAILED,
                error_message=str(exc),
                auth_bytes=b"",
                session_lifetime_ms=0,
            )
        if mechanism.done:
            self._authenticated(state)
        return self._response(
            ApiKey.SASL_AUTHENTICATE,
            version,
            error_code=NO_ERROR,
            error_message=None,
            auth_bytes=reply,
            session_lifetime_ms=0,
        )

    async def _sasl_delay(self) -> None:
        sasl = self.cluster.sasl
        if sasl is not None and sasl.reply_delay:
            await trio.sleep(sasl.reply_delay)  # a slow authenticator, on purpose


def topic_id(name: str) -> uuid.UUID:
    """The (stable) topic id of topic ``name`` in every fake cluster."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"corrfix-fake/{name}")


def record_values(records: Any) -> list[bytes | None]:
    """The values of every record in a Produce partition's record batches."""
    if not records:
        return []
    memory = MemoryRecords(bytes(records))
    values: list[bytes | None] = []
    while memory.has_next():
        batch = memory.next_batch()
        values.extend(record.value for record in batch)
    return values


class FakeCluster:
    """Several :class:`ClusterBroker` nodes that know each other; start with :meth:`start`."""

    def __init__(
        self,
        node_ids: tuple[int, ...] = (1, 2, 3),
        topics: dict[str, int] | None = None,
        *,
        coordinator: int = 2,
        controller: int | None = None,
        sasl: SaslSettings | None = None,
        changes: Changes | None = None,
    ) -> None:
        self.changes = changes or Changes()
        """Notified when a broker accepts a connection and when one ends."""
        self.topics = dict(topics if topics is not None else {"routed": 6})
        self.topic_ids = {name: topic_id(name) for name in self.topics}
        self.topic_names = {topic_id: name for name, topic_id in self.topic_ids.items()}
        self.node_ids = node_ids
        self.coordinator = coordinator
        self.controller = node_ids[0] if controller is None else controller
        self.sasl = sasl
        self.brokers = {node_id: ClusterBroker(self, node_id) for node_id in node_ids}
        real = BROKER_API_VERSIONS[REAL_BROKER_VERSION]
        self.api_ranges = {key: real[key] for key in SERVED | ADVERTISED_ONLY}
        if sasl is not None and sasl.handshake_max_version == 0:
            self.api_ranges[ApiKey.SASL_HANDSHAKE] = (0, 0)
            del self.api_ranges[ApiKey.SASL_AUTHENTICATE]

    def leader(self, topic: str, partition: int) -> int:
        """Partition p of every topic is led by the (p mod n)-th node."""
        del topic
        return self.node_ids[partition % len(self.node_ids)]

    async def start(self, nursery: trio.Nursery) -> None:
        """Bind every broker first (so each knows the others' ports), then serve them all."""
        for broker in self.brokers.values():
            await broker.bind()
        for broker in self.brokers.values():
            nursery.start_soon(broker.serve)

    @property
    def bootstrap(self) -> str:
        return self.brokers[self.node_ids[0]].address

    @property
    def ports(self) -> set[int]:
        return {broker.port for broker in self.brokers.values()}

    @property
    def accepted(self) -> int:
        return sum(broker.accepted for broker in self.brokers.values())

    @property
    def unhandled(self) -> list[tuple[int, Received]]:
        return [(node_id, r) for node_id, broker in self.brokers.items() for r in broker.unhandled]
