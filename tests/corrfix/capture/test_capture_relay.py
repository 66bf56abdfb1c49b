"""The real trio relay with a CaptureWriter as its observer, against the scripted broker."""

from __future__ import annotations

import trio

from corrfix.capture import CaptureWriter, read_capture
from corrfix.core import Address, RepairConfig
from corrfix.proxy import Proxy, ProxyConfig
from protocol import ApiKey
from protocol.testing import request_frame
from tests.support.fake_broker import FakeBroker, answers, read_frames
from tests.support.watch import Watch


# The echo broker's answers are no real Kafka bodies: use an api whose answers are never rewritten.
async def test_a_lost_answer_through_the_relay_is_captured_on_both_sides(tmp_path):
    broker = FakeBroker(script=lambda index, _api: "lose" if index == 1 else "answer")
    writer = CaptureWriter(tmp_path).start()
    watch = Watch(writer)
    try:
        async with trio.open_nursery() as nursery:
            broker_port = await nursery.start(broker.serve)
            config = ProxyConfig(
                Address("127.0.0.1", 0),
                Address("127.0.0.1", broker_port),
                repair=RepairConfig(probe_after=0.2, probe_min=0.01),
            )
            bound = await nursery.start(Proxy(config, observer=watch).serve)
            with trio.fail_after(10):
                stream = await trio.open_tcp_stream("127.0.0.1", bound[0].port)
                host, port = stream.socket.getsockname()[:2]
                client_address = f"{host}:{port}"
                await stream.send_all(
                    b"".join(request_frame(ApiKey.LIST_OFFSETS, 500 + i, i) for i in range(3))
                )
                got = answers(await read_frames(stream, 3))
                await stream.aclose()
                await watch.all_closed()
            nursery.cancel_scope.cancel()
    finally:
        writer.close()
    assert got == [(500, 0), (501, 1), (502, 2)]
    rows = read_capture(tmp_path).to_pylist()
    assert [r["seq"] for r in rows] == list(range(len(rows)))
    opened, closed = rows[0], rows[-1]
    assert opened["kind"] == "open" and opened["client_address"] == client_address
    assert opened["upstream_address"] == f"127.0.0.1:{broker_port}"
    assert closed["kind"] == "close" and closed["reason"] == "client closed"

    def frames(side, direction):
        return [
            (r["client_correlation_id"], r["upstream_correlation_id"])
            for r in rows
            if r["kind"] == "frame" and (r["side"], r["direction"]) == (side, direction)
        ]

    assert frames("client", "request") == [(500, 0), (501, 1), (502, 2)]
    assert frames("upstream", "request") == [(500, 0), (501, 1), (502, 2), (501, 3)]
    assert sorted(frames("upstream", "response")) == [(500, 0), (501, 3), (502, 2)]
    assert frames("client", "response") == [(500, 0), (501, 3), (502, 2)]
    repairs = [
        (r["event"], r["client_correlation_id"], r["upstream_correlation_id"])
        for r in rows
        if r["kind"] == "repair"
    ]
    assert ("skip_detected", 501, 1) in repairs and ("requeue", 501, 1) in repairs
    assert broker.requests == [(2, 0), (2, 1), (2, 2), (2, 3)]
