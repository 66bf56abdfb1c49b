"""Capture on Tansu through the real proxy with real clients, with and without a lossy link,
and the pcapng export checked against Wireshark's own Kafka dissector (tshark).

Each scenario runs once per module (a fixture) and several tests read its capture. The
tshark tests skip when tshark is missing, unless CORRFIX_REQUIRE_TSHARK=1 (as in CI).
"""

from __future__ import annotations

import functools
import subprocess
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from corrfix._netutil import free_port
from corrfix.capture import CaptureWriter, capture_info, read_capture, read_summaries
from corrfix.capture.pcap import export_pcapng
from corrfix.chaos import ChaosConfig, ChaosRelay, ChaosRules, serve_chaos
from corrfix.core import Address, RepairConfig
from corrfix.lab import TansuBroker
from corrfix.lab import workload as clients
from corrfix.proxy import Proxy, ProxyConfig
from protocol import ApiKey
from tests.support.tshark import require_tshark
from tests.support.watch import Watch

pytestmark = pytest.mark.broker

BROKER_PORT = 19092  # the port the pcapng export gives both synthesized servers


@dataclass
class Captured:
    directory: Path
    proxy: Proxy
    relay: ChaosRelay | None
    broker_port: int
    rows: list[dict]


async def in_thread(fn, *args, **kwargs):
    return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


def run_captured(
    directory: Path, workload: Callable[[str], Awaitable[None]], chaos: ChaosRules | None = None
) -> Captured:
    """client -> corrfix (capturing) [-> chaos relay] -> Tansu; every connection closed at the end."""

    async def main() -> Captured:
        port = free_port()
        with TansuBroker(advertised_port=port) as broker:
            writer = CaptureWriter(directory, flush_seconds=0.2).start()
            watch = Watch(writer)
            try:
                async with trio.open_nursery() as nursery:
                    relay, upstream = None, broker.port
                    if chaos is not None:
                        config = ChaosConfig("127.0.0.1", 0, "127.0.0.1", broker.port, rules=chaos)
                        relay = await nursery.start(serve_chaos, config)
                        upstream = relay.port
                    repair = RepairConfig(probe_after=0.5)
                    proxy_config = ProxyConfig(
                        Address("127.0.0.1", port), Address("127.0.0.1", upstream), repair
                    )
                    proxy = Proxy(proxy_config, observer=watch)
                    await nursery.start(proxy.serve)
                    with trio.fail_after(120):
                        await workload(f"127.0.0.1:{port}")
                        await watch.all_closed()
                    nursery.cancel_scope.cancel()
            finally:
                writer.close()
            return Captured(directory, proxy, relay, broker.port, read_capture(directory).to_pylist())

    return trio.run(main)


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Captured:
    """kafka-python produces 300 messages and reads them back."""

    async def workload(bootstrap: str) -> None:
        await in_thread(clients.create_topic, bootstrap, "cap")
        result = await in_thread(clients.produce_kafka_python, bootstrap, "cap", 300, acks=1)
        assert result.ok and result.correlation_errors == 0
        values = await in_thread(
            clients.consume_all, bootstrap, "cap", 300, timeout=60, client="kafka-python"
        )
        assert sorted(values) == clients.expected_values(300)

    return run_captured(tmp_path_factory.mktemp("plain"), workload)


@pytest.fixture(scope="module")
def lossy(tmp_path_factory) -> Captured:
    """A synchronous idempotent producer behind a link that drops every 10th Produce answer."""

    async def workload(bootstrap: str) -> None:
        await in_thread(clients.create_topic, bootstrap, "lossy")
        result = await in_thread(
            clients.produce_kafka_python, bootstrap, "lossy", 60, acks="all", sync=True, idempotent=True
        )
        assert result.ok and not result.errors and result.correlation_errors == 0

    return run_captured(
        tmp_path_factory.mktemp("lossy"), workload, ChaosRules(drop_every=10, apis={ApiKey.PRODUCE})
    )


def frames(rows: list[dict], side: str, direction: str) -> list[dict]:
    return [r for r in rows if r["kind"] == "frame" and (r["side"], r["direction"]) == (side, direction)]


def by_connection(rows: list[dict]) -> dict[str, list[dict]]:
    grouped = defaultdict(list)
    for row in rows:
        grouped[row["connection_id"]].append(row)
    return grouped


def test_capture_has_both_sides_of_every_connection(plain):
    rows = plain.rows
    connections = by_connection(rows)
    assert len(connections) == plain.proxy.stats.connections_opened >= 2
    for conn_rows in connections.values():
        assert [r["seq"] for r in conn_rows] == list(range(len(conn_rows)))
        opened, closed = conn_rows[0], conn_rows[-1]
        assert opened["kind"] == "open" and opened["upstream_address"] == f"127.0.0.1:{plain.broker_port}"
        assert opened["client_address"].startswith("127.0.0.1:")
        assert closed["kind"] == "close" and closed["reason"]
    for side in ("client", "upstream"):
        for direction in ("request", "response"):
            keys = {r["api_key"] for r in frames(rows, side, direction)}
            assert {ApiKey.API_VERSIONS, ApiKey.METADATA, ApiKey.PRODUCE, ApiKey.FETCH} <= keys, (
                side,
                direction,
            )
    assert all(
        r["frame"] is not None and len(r["frame"]) == r["frame_length"]
        for r in frames(rows, "client", "request")
    )
    summary = read_summaries(plain.directory)[0]
    assert (summary.finished, summary.rows_lost, summary.rows_written) == (True, 0, len(rows))
    info = capture_info(plain.directory)
    assert len(info["connections"]) == len(connections) and info["rows_lost"] == 0


def test_client_and_upstream_ids_line_up(plain):
    for conn_rows in by_connection(plain.rows).values():
        client_requests = frames(conn_rows, "client", "request")
        sent = frames(conn_rows, "upstream", "request")
        # On a loaded machine an answer can be late enough for a probe: those are the proxy's.
        upstream_requests = [r for r in sent if r["client_correlation_id"] is not None]
        assert all(r["api_key"] == 18 for r in sent if r["client_correlation_id"] is None)
        # No repairs on this link: every request went upstream once, in order, with a fresh id.
        harmless = {"stale_drop", "probe_sent"}
        assert not [r for r in conn_rows if r["kind"] == "repair" and r["event"] not in harmless]
        assert [
            (r["client_correlation_id"], r["upstream_correlation_id"], r["api_key"]) for r in client_requests
        ] == [
            (r["client_correlation_id"], r["upstream_correlation_id"], r["api_key"])
            for r in upstream_requests
        ]
        assert [r["upstream_correlation_id"] for r in sent] == list(range(len(sent)))
        for client, upstream in zip(client_requests, upstream_requests, strict=True):
            # The same bytes, apart from the four of the correlation id.
            assert (
                client["frame"][:8] == upstream["frame"][:8]
                and client["frame"][12:] == upstream["frame"][12:]
            )
            assert client["frame"][8:12] == client["client_correlation_id"].to_bytes(4, "big", signed=True)
            assert upstream["frame"][8:12] == upstream["upstream_correlation_id"].to_bytes(
                4, "big", signed=True
            )
        answered = {r["upstream_correlation_id"]: r for r in frames(conn_rows, "upstream", "response")}
        for delivered in frames(conn_rows, "client", "response"):
            source = answered[delivered["upstream_correlation_id"]]
            assert source["client_correlation_id"] == delivered["client_correlation_id"]
            assert source["api_key"] == delivered["api_key"]
            if delivered["api_key"] in (
                ApiKey.PRODUCE,
                ApiKey.FETCH,
            ):  # others may be rewritten for the client
                assert source["frame"][8:] == delivered["frame"][8:]
            assert delivered["frame"][4:8] == delivered["client_correlation_id"].to_bytes(
                4, "big", signed=True
            )


def test_dropped_answers_appear_as_skips_and_requeues(lossy):
    rows = lossy.rows
    dropped = lossy.relay.policy.totals().dropped
    assert dropped == 6
    repairs = [r for r in rows if r["kind"] == "repair"]
    kinds = Counter(r["event"] for r in repairs)
    assert kinds["skip_detected"] == kinds["requeue"] == dropped == lossy.proxy.stats.repairs["requeue"]
    assert kinds["probe_found_loss"] == dropped  # one Produce in flight: only a probe can tell
    for conn_rows in by_connection(rows).values():
        answered = {r["upstream_correlation_id"] for r in frames(conn_rows, "upstream", "response")}
        resent = {r["upstream_correlation_id"]: r for r in frames(conn_rows, "upstream", "request")}
        for requeue in (r for r in conn_rows if r.get("event") == "requeue"):
            assert requeue["api_key"] == ApiKey.PRODUCE and requeue["attempt"] == 2
            assert requeue["upstream_correlation_id"] not in answered  # the chaos relay dropped it
            again = resent[requeue["new_upstream_correlation_id"]]
            assert again["client_correlation_id"] == requeue["client_correlation_id"]
            assert again["new_upstream_correlation_id"] is None and again["api_key"] == ApiKey.PRODUCE
            assert requeue["new_upstream_correlation_id"] in answered


# -- tshark ------------------------------------------------------------------------------


def tshark_fields(pcapng: Path, *fields: str, display_filter: str = "kafka") -> list[list[str]]:
    command = [
        require_tshark(),
        "-r",
        str(pcapng),
        "-d",
        f"tcp.port=={BROKER_PORT},kafka",
        "-Y",
        display_filter,
    ]
    command += ["-T", "fields", "-E", "occurrence=f"] + [arg for field in fields for arg in ("-e", field)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return [line.split("\t") for line in done.stdout.splitlines()]


def test_tshark_decodes_every_frame_of_the_export_as_the_capture_says(plain, tmp_path):
    """Every frame's correlation id and every request's api key, per connection, side and
    direction. Response api keys only where this tshark's Kafka dissector could match the
    request: older Wiresharks do not know the newest api versions the clients use."""
    out = tmp_path / "plain.pcapng"
    stats = export_pcapng(plain.directory, out, broker_port=BROKER_PORT)
    fields = [
        "ip.src",
        "ip.dst",
        "tcp.srcport",
        "kafka.correlation_id",
        "kafka.request_key",
        "kafka.response_key",
    ]
    records = tshark_fields(out, *fields)
    assert len(records) == stats.frames == sum(r["kind"] == "frame" for r in plain.rows)
    got = defaultdict(list)
    for src, dst, sport, cid, request_key, response_key in records:
        direction = "response" if sport == str(BROKER_PORT) else "request"
        side = "client" if "127.0.0.2" in (src, dst) else "upstream"
        client_end = dst if direction == "response" else src
        number = int.from_bytes(bytes(int(part) for part in client_end.split(".")[2:]), "big")
        key = request_key if direction == "request" else response_key
        got[(number, side, direction)].append((int(cid), int(key) if key else None))
    numbers: dict[str, int] = {}
    expected = defaultdict(list)
    for row in plain.rows:
        number = numbers.setdefault(row["connection_id"], len(numbers))  # the export's numbering
        if row["kind"] == "frame":
            cid = row["client_correlation_id" if row["side"] == "client" else "upstream_correlation_id"]
            expected[(number, row["side"], row["direction"])].append((cid, row["api_key"]))
    assert got.keys() == expected.keys()
    decoded_keys = 0
    for group, decoded in got.items():
        assert [cid for cid, _ in decoded] == [cid for cid, _ in expected[group]], group
        for (_, key), (_, api_key) in zip(decoded, expected[group], strict=True):
            assert key is not None or group[2] == "response"
            if key is not None:
                assert key == api_key, group
                decoded_keys += 1
    assert decoded_keys > len(records) // 2


def test_tshark_shows_repairs_as_comments_on_the_resent_requests(lossy, tmp_path):
    out = tmp_path / "lossy.pcapng"
    export_pcapng(lossy.directory, out, broker_port=BROKER_PORT)
    records = tshark_fields(
        out,
        "kafka.correlation_id",
        "kafka.request_key",
        "frame.comment",
        display_filter='frame.comment contains "requeue"',
    )
    requeues = [r for r in lossy.rows if r.get("event") == "requeue"]
    assert len(records) == len(requeues) == 6
    for (cid, key, comment), requeue in zip(records, requeues, strict=True):
        assert (int(cid), int(key)) == (requeue["new_upstream_correlation_id"], ApiKey.PRODUCE)
        assert f"client_correlation_id={requeue['client_correlation_id']}" in comment


def test_tshark_finds_no_checksum_or_tcp_sequence_problems(plain, tmp_path):
    out = tmp_path / "check.pcapng"
    export_pcapng(plain.directory, out, broker_port=BROKER_PORT)
    command = [
        require_tshark(),
        "-r",
        str(out),
        "-o",
        "tcp.check_checksum:TRUE",
        "-o",
        "ip.check_checksum:TRUE",
    ]
    command += ["-Y", "tcp.checksum.status == 2 || ip.checksum.status == 2 || tcp.analysis.flags"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
