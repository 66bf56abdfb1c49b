"""The upstream check behind ``/readyz``: does each configured broker answer ApiVersions?

Every ``interval`` seconds each configured upstream bootstrap gets a fresh connection (TLS
as configured) and an ApiVersions v0 request, which every broker accepts, even before SASL
authentication; its answer has response header v0. The request is encoded and its answer
decoded by kafka-python, through :mod:`protocol`. Results go to :class:`Readiness`, which
decides; this module only does the I/O and says how a check failed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import structlog
import trio

from corrfix.core import Address
from corrfix.proxy._health import Readiness
from corrfix.proxy._tls import TlsConfig, connect_upstream
from protocol import (
    ApiKey,
    FrameDecoder,
    ProtocolError,
    request_class,
    response_class,
    response_correlation_id,
)

if TYPE_CHECKING:  # kafka-python loads with the first check, not at start
    from kafka.protocol.api_message import ApiMessage

log = structlog.get_logger("corrfix.readiness")

CLIENT_ID = "corrfix-ready"
CORRELATION_ID = 1
MAX_ANSWER_SIZE = 1024 * 1024
"""An ApiVersions v0 answer lists each api in 6 bytes; anything near this is not one."""
DEFAULT_READY_INTERVAL = 5.0
DEFAULT_READY_STALE = 15.0
NO_ERROR = 0


class CheckFailed(Exception):
    """An upstream did not answer ApiVersions properly; the message says how."""


def api_versions_request(correlation_id: int = CORRELATION_ID) -> bytes:
    """A framed ApiVersions v0 request (request header v1)."""
    cls = request_class(ApiKey.API_VERSIONS)
    assert cls is not None  # kafka-python 3 ships ApiVersionsRequest
    message: ApiMessage = cls(version=0)
    message.with_header(correlation_id=correlation_id, client_id=CLIENT_ID)
    return bytes(message.encode(header=True, framed=True))


def check_api_versions_answer(frame: bytes | bytearray, correlation_id: int = CORRELATION_ID) -> int:
    """The number of apis the broker lists; raises :class:`CheckFailed` for a wrong answer."""
    got = response_correlation_id(frame)
    if got != correlation_id:
        raise CheckFailed(f"answer has correlation id {got}, not {correlation_id}")
    cls = response_class(ApiKey.API_VERSIONS)
    assert cls is not None
    try:
        answer = cls.decode(bytes(frame), version=0, header=True, framed=True)
    except Exception as exc:  # kafka-python raises several types for a malformed body
        raise CheckFailed(f"undecodable ApiVersions answer: {exc}") from exc
    if answer.error_code != NO_ERROR:
        raise CheckFailed(f"ApiVersions answered with error code {answer.error_code}")
    return len(answer.api_keys)


async def check_upstream(upstream: Address, tls: TlsConfig | None, timeout: float) -> int:
    """One ApiVersions round trip to ``upstream`` within ``timeout``; the apis it lists."""
    deadline = trio.current_time() + timeout
    stream: trio.SocketStream | None = None
    with trio.move_on_at(deadline):
        try:
            stream = await trio.open_tcp_stream(upstream.host, upstream.port)
        except OSError as exc:
            raise CheckFailed(f"cannot connect: {_connect_error(exc)}") from exc
    if stream is None:
        raise CheckFailed(f"cannot connect within {timeout:g} s")
    try:
        failure = _HandshakeFailure()
        connected = await connect_upstream(
            stream, tls, upstream.host, deadline - trio.current_time(), failure
        )
        if connected is None:
            raise CheckFailed(failure.reason)
        with trio.move_on_at(deadline):
            await connected.send_all(api_versions_request())
            decoder = FrameDecoder(MAX_ANSWER_SIZE, peer=str(upstream))
            while True:
                data = await connected.receive_some(65536)
                if not data:
                    raise CheckFailed("the broker closed the connection without answering")
                frames = decoder.feed(data)
                if frames:
                    return check_api_versions_answer(frames[0])
    except (trio.BrokenResourceError, OSError) as exc:
        raise CheckFailed(f"connection broken: {exc}") from exc
    except ProtocolError as exc:  # a bad frame size, or a frame too short for a header
        raise CheckFailed(f"not a Kafka answer: {exc}") from exc
    finally:
        await trio.aclose_forcefully(stream)
    raise CheckFailed(f"no answer within {timeout:g} s")


class _HandshakeFailure:
    """Takes the log line a failed TLS handshake would write, for the check's reason instead:
    a failing check is logged once, not at every interval."""

    reason = "TLS handshake failed"

    def error(self, event: str, **fields: object) -> None:
        self.reason = f"{event}: {fields.get('reason')}"


CheckFunction = Callable[[Address, TlsConfig | None, float], Awaitable[int]]
"""One upstream check: the upstream, TLS and a timeout; raises :class:`CheckFailed`."""


async def run_readiness_checks(
    readiness: Readiness,
    *,
    interval: float = DEFAULT_READY_INTERVAL,
    timeout: float = 10.0,
    tls: TlsConfig | None = None,
    check: CheckFunction = check_upstream,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Check every upstream now and then every ``interval`` seconds, until cancelled.

    The upstreams are checked concurrently; a check takes at most ``min(timeout,
    interval)``. ``clock`` timestamps the results for :class:`Readiness`, whose verdicts
    the HTTP thread asks for with the same clock.
    """
    limit = min(timeout, interval)
    while True:
        next_round = trio.current_time() + interval
        async with trio.open_nursery() as nursery:
            for upstream in readiness.upstreams:
                nursery.start_soon(_check_one, readiness, upstream, tls, limit, check, clock)
        await trio.sleep_until(next_round)


async def _check_one(
    readiness: Readiness,
    upstream: Address,
    tls: TlsConfig | None,
    timeout: float,
    check: CheckFunction,
    clock: Callable[[], float],
) -> None:
    started = clock()
    try:
        await check(upstream, tls, timeout)
    except CheckFailed as exc:
        now = clock()
        if readiness.check(upstream).error is None:  # say it once, not every interval
            log.warning("upstream check failed", upstream=str(upstream), error=str(exc))
        readiness.failed(upstream, now, str(exc))
        return
    now = clock()
    if readiness.check(upstream).error is not None:
        log.info("upstream answers again", upstream=str(upstream))
    readiness.answered(upstream, now, now - started)


def _connect_error(exc: OSError) -> str:
    """The reason of the last attempt (``Connection refused``), not trio's summary of them all."""
    attempts = getattr(exc.__cause__, "exceptions", ())
    last = attempts[-1] if attempts else exc
    return (last.strerror if isinstance(last, OSError) and last.strerror else None) or str(last)
