"""The upstream ApiVersions check behind /readyz, against Tansu and against peers that misbehave."""

from __future__ import annotations

import functools

import pytest
import trio
import trio.testing

from corrfix.core import Address
from corrfix.proxy import TlsConfig
from corrfix.proxy._health import Readiness
from corrfix.proxy._readiness import (
    CheckFailed,
    api_versions_request,
    check_api_versions_answer,
    check_upstream,
    run_readiness_checks,
)
from protocol import ApiKey, parse_request_header, response_class


def api_versions_answer(correlation_id: int, error_code: int = 0) -> bytes:
    cls = response_class(ApiKey.API_VERSIONS)
    message = cls(version=0, error_code=error_code, api_keys=[(18, 0, 3), (0, 0, 9)])
    message.with_header(correlation_id=correlation_id)
    return bytes(message.encode(header=True, framed=True))


def test_the_request_is_api_versions_v0_with_a_client_id():
    header = parse_request_header(api_versions_request(7))
    assert (header.api_key, header.api_version, header.correlation_id) == (ApiKey.API_VERSIONS, 0, 7)
    assert header.client_id == "corrfix-ready"


def test_answers_are_decoded_and_checked():
    assert check_api_versions_answer(api_versions_answer(1)) == 2
    with pytest.raises(CheckFailed, match="correlation id 2, not 1"):
        check_api_versions_answer(api_versions_answer(2))
    with pytest.raises(CheckFailed, match="error code 35"):
        check_api_versions_answer(api_versions_answer(1, error_code=35))
    with pytest.raises(CheckFailed, match="undecodable"):
        check_api_versions_answer(api_versions_answer(1)[:-3])


async def test_tansu_answers_and_a_stopped_tansu_is_named(tansu):
    upstream = Address("127.0.0.1", tansu.port)
    assert await check_upstream(upstream, None, 5.0) >= 30  # Tansu lists 36 apis
    tansu.stop()
    with pytest.raises(CheckFailed, match=r"cannot connect: .*Connection refused"):
        await check_upstream(upstream, None, 5.0)


async def test_tls_to_a_plaintext_tansu_says_so(tansu):
    tls = TlsConfig(upstream_tls=True)
    with pytest.raises(CheckFailed, match=r"TLS handshake with upstream failed: .*drop --upstream-tls"):
        await check_upstream(Address("127.0.0.1", tansu.port), tls, 1.0)


async def serve_once(behaviour, *, task_status=trio.TASK_STATUS_IGNORED):
    """A listener that does ``behaviour(stream)`` with its first connection."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    task_status.started(Address("127.0.0.1", listener.socket.getsockname()[1]))
    async with listener:
        stream = await listener.accept()
        async with stream:
            await behaviour(stream)


async def close_at_once(stream):
    await stream.receive_some(100)


async def never_answer(stream):
    await trio.sleep_forever()


async def answer_garbage(stream):
    await stream.receive_some(100)
    await stream.send_all(b"\xff\xff\xff\xff")  # a negative frame size


async def test_a_peer_that_closes_without_answering():
    async with trio.open_nursery() as nursery:
        upstream = await nursery.start(serve_once, close_at_once)
        with pytest.raises(CheckFailed, match="closed the connection without answering"):
            await check_upstream(upstream, None, 5.0)


async def test_a_peer_that_is_not_kafka():
    async with trio.open_nursery() as nursery:
        upstream = await nursery.start(serve_once, answer_garbage)
        with pytest.raises(CheckFailed, match="not a Kafka answer"):
            await check_upstream(upstream, None, 5.0)


async def answer_an_empty_frame(stream):
    await stream.receive_some(100)
    await stream.send_all(b"\0\0\0\0")  # a frame too short to hold a correlation id


async def test_a_peer_whose_answer_has_no_header_fails_the_check():
    """The answer's ProtocolError escaped the check, and the proxy it ran in stopped with it."""
    async with trio.open_nursery() as nursery:
        upstream = await nursery.start(serve_once, answer_an_empty_frame)
        with pytest.raises(CheckFailed, match="not a Kafka answer: response frame of 0 bytes has no header"):
            await check_upstream(upstream, None, 5.0)


async def test_a_peer_that_never_answers_times_out(autojump_clock):
    async with trio.open_nursery() as nursery:
        upstream = await nursery.start(serve_once, never_answer)
        with pytest.raises(CheckFailed, match="no answer within 3 s"):
            await check_upstream(upstream, None, 3.0)
        assert trio.current_time() >= 3.0  # the autojump clock skipped the wait
        nursery.cancel_scope.cancel()


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


async def test_checks_run_every_interval_and_record_each_result(autojump_clock):
    up, down = Address("up", 1), Address("down", 2)
    readiness = Readiness([up, down], stale=10)
    seen: list[tuple[float, Address]] = []

    async def check(upstream, tls, timeout):
        seen.append((trio.current_time(), upstream))
        await trio.sleep(0.5)  # the round trip
        if upstream == down:
            raise CheckFailed("cannot connect: Connection refused")
        return 36

    checks = functools.partial(
        run_readiness_checks, readiness, interval=5, timeout=2, check=check, clock=trio.current_time
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(checks)
        await trio.sleep(12)
        nursery.cancel_scope.cancel()
    assert sorted((time, str(upstream)) for time, upstream in seen) == [
        (0, "down:2"),
        (0, "up:1"),
        (5, "down:2"),
        (5, "up:1"),
        (10, "down:2"),
        (10, "up:1"),
    ]
    assert readiness.check(up).answered_at == 10.5 and readiness.check(up).answer_seconds == 0.5
    assert readiness.check(down).answered_at is None
    assert readiness.check(down).error == "cannot connect: Connection refused"
    verdict = readiness.verdict(12)
    assert verdict.ok  # one bootstrap broker answering is enough
    assert verdict.detail["upstreams"][1] == {
        "upstream": "down:2",
        "ok": False,
        "last_error": "cannot connect: Connection refused",
    }


async def test_a_slow_check_is_cut_at_the_interval(autojump_clock):
    readiness = Readiness([Address("slow", 1)], stale=10)
    limits: list[float] = []

    async def check(upstream, tls, timeout):
        limits.append(timeout)
        return 1

    checks = functools.partial(
        run_readiness_checks, readiness, interval=1, timeout=10, check=check, clock=trio.current_time
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(checks)
        await trio.sleep(0.5)
        nursery.cancel_scope.cancel()
    assert limits == [1]
