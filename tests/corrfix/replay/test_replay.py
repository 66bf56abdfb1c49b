"""``corrfix replay`` against small trio fake brokers: order, timing, causality, and every difference."""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import trio

from corrfix._netutil import free_port
from corrfix.capture.pcap import add_import_command, import_pcap
from corrfix.replay import (
    ReplayConfig,
    Status,
    build_report,
    error_codes,
    load_plan,
    register_command,
    render_text,
    replay,
)
from protocol import ApiKey, FrameDecoder, RequestHeader, parse_request_header, produce_acks
from tests.support.kafka_frames import api_versions, metadata, produce
from tests.support.tcp_synth import Segment, TcpSession, write_packets

START_NS = 1_700_000_000_000_000_000


@dataclass
class Step:
    """A message on captured connection ``conn`` at ``at_ms`` after the start."""

    conn: int
    from_client: bool
    frame: bytes
    at_ms: float


def make_capture(tmp_path: Path, steps: list[Step], snaplen: int | None = None) -> Path:
    """A wire capture of the steps (one TCP connection per ``conn``), imported into a capture dir."""
    sessions: dict[int, TcpSession] = {}
    packets: list[tuple[TcpSession, Segment]] = []

    def stamp(session: TcpSession, segments: list[Segment], at_ns: int) -> None:
        packets.extend((session, replace(seg, ts_ns=at_ns + i * 1000)) for i, seg in enumerate(segments))

    for step in steps:
        at_ns = START_NS + int(step.at_ms * 1_000_000)
        if step.conn not in sessions:
            session = TcpSession(client=("127.0.0.1", 41000 + step.conn), server=("127.0.0.1", 9092))
            sessions[step.conn] = session
            stamp(session, session.handshake(), at_ns - 100_000)
        stamp(
            sessions[step.conn], sessions[step.conn].send(step.from_client, step.frame, with_ack=True), at_ns
        )
    end = max(seg.ts_ns for _, seg in packets) + 1_000_000
    for session in sessions.values():
        stamp(session, [session.fin(True), session.fin(False)], end)
    source = write_packets(tmp_path / "wire.pcap", packets, snaplen=snaplen)
    out = tmp_path / "capture"
    import_pcap(source, out, [9092])
    return out


def exchange_steps(conn: int, exchanges: list, start_ms: float, gap_ms: float = 1.0) -> list[Step]:
    """Request, then its response ``gap_ms`` later, one exchange after the other."""
    steps, t = [], start_ms
    for exchange in exchanges:
        steps.append(Step(conn, True, exchange.request, t))
        if exchange.response is not None:
            steps.append(Step(conn, False, exchange.response, t + gap_ms))
        t += 2 * gap_ms
    return steps


Answer = Callable[[int, RequestHeader, bytes], Awaitable[bytes | None]]


def standard_answer(header: RequestHeader, frame: bytes, produce_error: int = 0) -> bytes | None:
    cid = header.correlation_id
    if header.api_key == ApiKey.API_VERSIONS:
        return api_versions(cid).response
    if header.api_key == ApiKey.METADATA:
        return metadata(cid).response
    if header.api_key == ApiKey.PRODUCE:
        if produce_acks(frame, header) == 0:
            return None
        return produce(cid, b"", error_code=produce_error).response
    raise AssertionError(f"unexpected api key {header.api_key}")


@dataclass
class FakeBroker:
    """Answers each request frame with whatever ``answer`` returns (None: nothing)."""

    answer: Answer
    log: list[tuple[str, int, int]] = field(default_factory=list)  # (event, connection #, cid)
    received: dict[int, list[bytes]] = field(default_factory=dict)
    port: int = 0
    _connections: int = 0

    async def start(self, nursery: trio.Nursery) -> FakeBroker:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, self._handle, 0, host="127.0.0.1"))
        self.port = listeners[0].socket.getsockname()[1]
        return self

    async def _handle(self, stream: trio.SocketStream) -> None:
        number = self._connections
        self._connections += 1
        self.received[number] = []
        decoder = FrameDecoder()
        async with stream:
            async for data in stream:
                for frame in decoder.feed(data):
                    header = parse_request_header(frame)
                    self.received[number].append(bytes(frame))
                    self.log.append(("request", number, header.correlation_id))
                    reply = await self.answer(number, header, bytes(frame))
                    if reply is None:
                        continue
                    if reply == b"close":
                        return
                    await stream.send_all(reply)
                    self.log.append(("answer", number, header.correlation_id))


async def standard(_conn: int, header: RequestHeader, frame: bytes) -> bytes | None:
    return standard_answer(header, frame)


async def run_replay(capture: Path, port: int, **config) -> dict:
    config.setdefault("speed", None)
    config.setdefault("response_timeout", 2.0)
    result = await replay(load_plan(capture), ReplayConfig("127.0.0.1", port, **config))
    return build_report(result) | {"_result": result}


# -- agreement -------------------------------------------------------------------------------


async def test_replay_of_a_faithful_target_shows_no_differences(tmp_path):
    conn0 = [api_versions(1), metadata(2), produce(3, b"a" * 3000), produce(4, b"b" * 10)]
    conn1 = [api_versions(7), produce(8, b"c" * 50)]
    capture = make_capture(tmp_path, exchange_steps(0, conn0, 0) + exchange_steps(1, conn1, 0.5))
    async with trio.open_nursery() as nursery:
        broker = await FakeBroker(standard).start(nursery)
        report = await run_replay(capture, broker.port)
        nursery.cancel_scope.cancel()
    assert report["differences"] == []
    assert (report["requests"], report["answered"], report["connections"]) == (6, 6, 2)
    received = sorted(broker.received.values(), key=len, reverse=True)
    assert received == [[e.request for e in conn0], [e.request for e in conn1]]
    produce_row = next(row for row in report["by_api"] if row["api"] == "Produce")
    assert produce_row["requests"] == 3 and produce_row["captured_ms"]["p50"] == pytest.approx(1.0, abs=0.01)
    assert produce_row["replayed_ms"]["p99"] is not None
    assert "no differences from the capture" in render_text(report)


async def test_pipelined_requests_are_sent_without_waiting_for_answers(tmp_path):
    exchanges = [produce(10 + i, b"p" * 200) for i in range(3)]
    steps = [Step(0, True, e.request, 0.1 * i) for i, e in enumerate(exchanges)]
    steps += [Step(0, False, e.response, 1 + 0.1 * i) for i, e in enumerate(exchanges)]
    capture = make_capture(tmp_path, steps)
    seen: list[RequestHeader] = []

    async def answer_all_at_the_third(_conn: int, header: RequestHeader, frame: bytes) -> bytes | None:
        seen.append(header)
        if len(seen) < 3:
            return None
        return b"".join(produce(h.correlation_id, b"").response for h in seen)

    async with trio.open_nursery() as nursery:
        broker = await FakeBroker(answer_all_at_the_third).start(nursery)
        report = await run_replay(capture, broker.port)
        nursery.cancel_scope.cancel()
    assert report["answered"] == 3 and report["differences"] == []


async def test_causal_order_holds_across_connections(tmp_path):
    """Connection 1's request was captured after connection 0's answer: it waits for it."""
    steps = [
        Step(0, True, metadata(1).request, 0),
        Step(0, False, metadata(1).response, 1),
        Step(1, True, api_versions(5).request, 2),
        Step(1, False, api_versions(5).response, 3),
    ]
    capture = make_capture(tmp_path, steps)

    async def slow_metadata(_conn: int, header: RequestHeader, frame: bytes) -> bytes | None:
        if header.api_key == ApiKey.METADATA:
            await trio.sleep(0.2)  # a slow broker, not synchronisation
        return standard_answer(header, frame)

    async with trio.open_nursery() as nursery:
        broker = await FakeBroker(slow_metadata).start(nursery)
        report = await run_replay(capture, broker.port)
        nursery.cancel_scope.cancel()
    assert report["differences"] == []
    events = [(event, cid) for event, _, cid in broker.log]
    assert events == [("request", 1), ("answer", 1), ("request", 5), ("answer", 5)]


async def test_speed_scales_the_captured_gaps(tmp_path):
    steps = exchange_steps(0, [api_versions(1)], 0) + exchange_steps(0, [metadata(2)], 800)
    capture = make_capture(tmp_path, steps)
    async with trio.open_nursery() as nursery:
        broker = await FakeBroker(standard).start(nursery)
        report = await run_replay(capture, broker.port, speed=4.0)
        nursery.cancel_scope.cancel()
    result = report["_result"]
    first, second = result.outcomes
    # 800 ms after the first request in the capture, at 4x: 200 ms after the replay began.
    assert second.sent_ns - result.started_ns >= 199_900_000 > first.sent_ns - result.started_ns
    assert report["speed"] == 4.0 and report["differences"] == []


async def test_acks0_produce_is_not_waited_for(tmp_path):
    exchanges = [produce(1, b"z" * 100, acks=0), api_versions(2)]
    capture = make_capture(tmp_path, exchange_steps(0, exchanges, 0))
    async with trio.open_nursery() as nursery:
        broker = await FakeBroker(standard).start(nursery)
        report = await run_replay(capture, broker.port)
        nursery.cancel_scope.cancel()
    statuses = [o.status for o in report["_result"].outcomes]
    assert statuses == [Status.NO_ANSWER_EXPECTED, Status.ANSWERED]
    assert report["differences"] == []


# -- differences -----------------------------------------------------------------------------


async def test_missing_response_when_the_target_never_answers(tmp_path):
    capture = make_capture(tmp_path, exchange_steps(0, [api_versions(1), metadata(2)], 0))

    async def never(_conn: int, header: RequestHeader, frame: bytes) -> bytes | None:
        return None

    async with trio.open_nursery() as nursery:
        broker = await FakeBroker(never).start(nursery)
        with trio.fail_after(10):
            report = await run_replay(capture, broker.port, response_timeout=0.3)
        nursery.cancel_scope.cancel()
    kinds = [(d["kind"], d["correlation_id"]) for d in report["differences"]]
    assert kinds == [("missing_response", 1), ("not_sent", 2)]
    assert report["differences"][0]["detail"] == "no response within 0.3 s"
    assert (report["missing_responses"], report["not_sent"]) == (1, 1)
    text = render_text(report)
    assert "missing_response" in text and "ApiVersions" in text


async def test_missing_response_when_the_target_closes(tmp_path):
    capture = make_capture(tmp_path, exchange_steps(0, [api_versions(1), metadata(2), api_versions(3)], 0))

    async def close_on_metadata(_conn: int, header: RequestHeader, frame: bytes) -> bytes | None:
        return b"close" if header.api_key == ApiKey.METADATA else standard_answer(header, frame)

    async with trio.open_nursery() as nursery:
        broker = await FakeBroker(close_on_metadata).start(nursery)
        report = await run_replay(capture, broker.port)
        nursery.cancel_scope.cancel()
    assert [(d["kind"], d["correlation_id"]) for d in report["differences"]] == [
        ("missing_response", 2),
        ("not_sent", 3),
    ]
    assert report["differences"][0]["detail"] == "the target closed the connection"


async def test_error_codes_that_differ_from_the_capture(tmp_path):
    capture = make_capture(tmp_path, exchange_steps(0, [produce(1, b"v" * 64), api_versions(2)], 0))

    async def unknown_topic(_conn: int, header: RequestHeader, frame: bytes) -> bytes | None:
        return standard_answer(header, frame, produce_error=3)

    async with trio.open_nursery() as nursery:
        broker = await FakeBroker(unknown_topic).start(nursery)
        report = await run_replay(capture, broker.port)
        nursery.cancel_scope.cancel()
    [diff] = report["differences"]
    assert diff["kind"] == "error_codes" and diff["api"] == "Produce"
    assert diff["detail"] == (
        "captured: none; replayed: "
        "responses[events].partition_responses[0].error_code=3 UNKNOWN_TOPIC_OR_PARTITION"
    )
    assert report["error_differences"] == 1


async def test_truncated_requests_are_skipped_and_reported(tmp_path):
    exchanges = [api_versions(1), produce(2, b"t" * 500), api_versions(3)]
    capture = make_capture(tmp_path, exchange_steps(0, exchanges, 0), snaplen=14 + 20 + 20 + 200)
    async with trio.open_nursery() as nursery:
        broker = await FakeBroker(standard).start(nursery)
        report = await run_replay(capture, broker.port)
        nursery.cancel_scope.cancel()
    [diff] = report["differences"]
    assert (diff["kind"], diff["correlation_id"]) == ("skipped_truncated", 2)
    assert diff["detail"] == f"captured 200 of {len(exchanges[1].request)} bytes"
    assert broker.received[0] == [exchanges[0].request, exchanges[2].request]


async def test_stray_responses_are_reported(tmp_path):
    capture = make_capture(tmp_path, exchange_steps(0, [api_versions(1)], 0))

    async def with_a_stray(_conn: int, header: RequestHeader, frame: bytes) -> bytes | None:
        return api_versions(99).response + standard_answer(header, frame)

    async with trio.open_nursery() as nursery:
        broker = await FakeBroker(with_a_stray).start(nursery)
        report = await run_replay(capture, broker.port)
        nursery.cancel_scope.cancel()
    assert [(d["kind"], d["correlation_id"]) for d in report["differences"]] == [("stray_response", 99)]
    assert report["answered"] == 1


def test_error_codes_walks_every_nested_error_code():
    frame = produce(1, b"", error_code=6).response
    assert error_codes(frame, ApiKey.PRODUCE, 9) == {"responses[events].partition_responses[0].error_code": 6}
    assert error_codes(produce(1, b"").response, ApiKey.PRODUCE, 9) == {}
    assert error_codes(frame[:12], ApiKey.PRODUCE, 9) is None


# -- command line ----------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="corrfix")
    commands = parser.add_subparsers(dest="command", required=True)
    register_command(commands)
    capture = commands.add_parser("capture").add_subparsers(dest="capture_command", required=True)
    add_import_command(capture)
    return parser.parse_args(argv)


def test_cli_import_then_replay_to_a_dead_target(tmp_path, capsys):
    make_capture(tmp_path, exchange_steps(0, [api_versions(1), metadata(2)], 0))
    args = parse(["capture", "import-pcap", str(tmp_path / "wire.pcap"), "-o", str(tmp_path / "cli")])
    assert args.run(args) == 0
    assert "connections 1, requests 2, responses 2" in capsys.readouterr().out

    port = free_port()  # nothing listens there
    args = parse(
        ["replay", str(tmp_path / "cli"), "--target", f"127.0.0.1:{port}", "--json", "--speed", "50"]
    )
    assert args.run(args) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["not_sent"] == 2 and report["sent"] == 0
    assert report["differences"][0]["detail"].startswith(f"cannot connect to 127.0.0.1:{port}")


def test_cli_errors(tmp_path, capsys):
    args = parse(["capture", "import-pcap", str(tmp_path / "absent.pcap"), "-o", str(tmp_path / "x")])
    assert args.run(args) == 2
    (tmp_path / "empty").mkdir()
    args = parse(["replay", str(tmp_path / "empty"), "--target", "127.0.0.1:9"])
    assert args.run(args) == 2
    assert "no client requests to replay" in capsys.readouterr().err
    args = parse(["replay", str(tmp_path / "absent"), "--target", "127.0.0.1:9"])
    assert args.run(args) == 2
    assert "absent does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["replay", str(tmp_path), "--target", "127.0.0.1:9", "--speed", "2", "--as-fast-as-possible"])
    for bad in (["--max-differences", "-1"], ["--max-frame-size", "0"]):  # -1 dropped the last one
        with pytest.raises(SystemExit):
            parse(["replay", str(tmp_path), "--target", "127.0.0.1:9", *bad])
    with pytest.raises(SystemExit):
        parse(["replay", str(tmp_path), "--target", "nonsense"])


async def test_a_clock_stepping_back_mid_capture_does_not_hang_the_replay(tmp_path):
    """The second exchange's times are earlier than the first's (the clock was set back
    between them); read as is, the first request would wait for the second's answer."""
    steps = exchange_steps(0, [api_versions(1)], 100) + exchange_steps(0, [metadata(2)], 20)
    capture = make_capture(tmp_path, steps)
    async with trio.open_nursery() as nursery:
        broker = await FakeBroker(standard).start(nursery)
        with trio.fail_after(5):
            report = await run_replay(capture, broker.port)
        nursery.cancel_scope.cancel()
    assert report["answered"] == 2 and report["differences"] == []
