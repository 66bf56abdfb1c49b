"""TLS on either side of the proxy, wrong-protocol peers both ways, and a real client over TLS.

A throwaway CA, a server certificate (127.0.0.1 and localhost) and a client certificate are
made once per session with the openssl command line.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import ssl
import subprocess
import sys
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import structlog
import trio
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from corrfix._cli import _with_config_file, build_parser, proxy_config_from_args
from corrfix.core import Address
from corrfix.lab import workload as clients
from corrfix.proxy import (
    Proxy,
    ProxyConfig,
    ProxyMetrics,
    ProxyService,
    TlsConfig,
    TlsError,
    tls_config_from_args,
)
from corrfix.proxy import _metrics as metrics_module
from corrfix.proxy._health import Liveness
from corrfix.proxy._tls import TlsContextStore, connect_upstream, tls_store
from protocol import ApiKey, FrameDecoder, ProtocolError
from protocol.testing import request_frame
from tests.support.fake_broker import FakeBroker, answers, read_frames
from tests.support.polling import wait_until
from tests.support.relay import FAST_REPAIR

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")

LOOPBACK = "127.0.0.1"
JAVA_STYLE_ALERT = bytes.fromhex("15030300020250")  # fatal protocol_version, what a JVM broker answers
HANDSHAKE_TIMEOUT = 2.0
"""The proxy's connect and handshake limit where a test waits one out: long enough that a good
client's handshake on a loaded machine never runs into it."""


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here
    next_server_cert: Path  # the server's next certificate, as a rotation brings it
    next_server_key: Path


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def _make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return cert, key


def _make_leaf(directory: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    cert, key, csr, ext = (directory / f"{name}.{suffix}" for suffix in ("pem", "key", "csr", "ext"))
    ext.write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nsubjectKeyIdentifier=hash\n"
        f"authorityKeyIdentifier=keyid\n{extensions}\n"
    )
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", csr, "-subj", f"/CN={name}",
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
        "-out", cert, "-days", "2", "-extfile", ext,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    directory = tmp_path_factory.mktemp("tls")
    ca = _make_ca(directory, "corrfix-test-ca")
    server = _make_leaf(
        directory, "server", ca, "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost"
    )
    client = _make_leaf(directory, "client", ca, "extendedKeyUsage=clientAuth")
    other_ca, _ = _make_ca(directory, "other-ca")
    next_server = _make_leaf(
        directory, "server-next", ca, "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost"
    )
    return Certs(ca[0], *server, *client, other_ca, *next_server)


def server_context(certs: Certs, *, require_client_cert: bool = False) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.server_cert, certs.server_key)
    if require_client_cert:
        context.load_verify_locations(certs.ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(certs: Certs, *, with_cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=certs.ca)
    if with_cert:
        context.load_cert_chain(certs.client_cert, certs.client_key)
    return context


@dataclass
class TlsFakeBroker(FakeBroker):
    """The scripted broker behind TLS, recording the SNI it was sent and failed handshakes."""

    context: ssl.SSLContext | None = None
    server_names: list[str | None] = field(default_factory=list)
    handshake_errors: list[str] = field(default_factory=list)

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        assert self.context is not None
        self.context.sni_callback = lambda _sock, name, _ctx: self.server_names.append(name)
        listeners = await trio.open_tcp_listeners(0, host=LOOPBACK)
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._handle_tls, listeners)

    async def _handle_tls(self, stream: trio.SocketStream) -> None:
        assert self.context is not None
        tls = trio.SSLStream(stream, self.context, server_side=True)
        try:
            with trio.fail_after(5):
                await tls.do_handshake()
        except (trio.BrokenResourceError, trio.TooSlowError) as exc:
            self.handshake_errors.append(str(exc.__cause__ or exc))
            await trio.aclose_forcefully(tls)
            return
        await self._handle(tls)


async def start_proxy(nursery: trio.Nursery, upstream_port: int, tls: TlsConfig | None, **kwargs) -> int:
    config = ProxyConfig(
        Address(LOOPBACK, 0), Address(LOOPBACK, upstream_port), repair=FAST_REPAIR, tls=tls, **kwargs
    )
    bound = await nursery.start(Proxy(config).serve)
    return bound[0].port


async def open_tls(port: int, context: ssl.SSLContext) -> trio.SSLStream:
    stream = await trio.open_ssl_over_tcp_stream(LOOPBACK, port, ssl_context=context)
    await stream.do_handshake()
    return stream


async def round_trip(stream: trio.abc.Stream, n: int = 20) -> list[tuple[int, int]]:
    """Send ``n`` requests at once and return the (client id, token) of the answers."""
    await stream.send_all(b"".join(request_frame(ApiKey.LIST_OFFSETS, 100 + i, i * 3) for i in range(n)))
    return answers(await read_frames(stream, n))


def expected(n: int = 20) -> list[tuple[int, int]]:
    return [(100 + i, i * 3) for i in range(n)]


async def closed_by_peer(stream: trio.abc.Stream) -> bool:
    """True once the peer closes; TLS without close_notify counts (that is how corrfix closes)."""
    try:
        while await stream.receive_some(65536):
            pass
    except trio.BrokenResourceError:
        pass
    return True


def events(logs: list[dict], event: str) -> list[dict]:
    return [entry for entry in logs if entry["event"] == event]


def reasons(logs: list[dict], event: str) -> list[str]:
    return [str(entry.get("reason")) for entry in events(logs, event)]


# -- working combinations ----------------------------------------------------------------------


async def test_tls_clients_with_a_plaintext_broker(certs):
    broker = FakeBroker()
    tls = TlsConfig(certfile=certs.server_cert, keyfile=certs.server_key)
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            port = await start_proxy(nursery, await nursery.start(broker.serve), tls)
            with trio.fail_after(10):
                stream = await open_tls(port, client_context(certs))
                assert await round_trip(stream) == expected()
            nursery.cancel_scope.cancel()
    opened = events(logs, "connection opened")
    assert len(opened) == 1 and opened[0]["client"].startswith(f"{LOOPBACK}:")  # the peer behind TLS


async def test_plaintext_clients_with_a_tls_broker(certs):
    broker = TlsFakeBroker(context=server_context(certs))
    tls = TlsConfig(upstream_tls=True, upstream_cafile=certs.ca)
    async with trio.open_nursery() as nursery:
        port = await start_proxy(nursery, await nursery.start(broker.serve), tls)
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream(LOOPBACK, port)
            assert await round_trip(stream) == expected()
        nursery.cancel_scope.cancel()
    assert broker.server_names == [None]  # an IP address is verified, never sent as SNI
    assert broker.handshake_errors == []


async def test_client_half_close_with_a_tls_broker_still_gets_every_answer(certs):
    """TLS cannot half-close, so the client's end of stream stays with corrfix; answers still flow."""
    broker = TlsFakeBroker(context=server_context(certs))
    tls = TlsConfig(upstream_tls=True, upstream_cafile=certs.ca)
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            port = await start_proxy(nursery, await nursery.start(broker.serve), tls)
            with trio.fail_after(10):
                stream = await trio.open_tcp_stream(LOOPBACK, port)
                await stream.send_all(b"".join(request_frame(ApiKey.LIST_OFFSETS, i, i) for i in range(5)))
                await stream.send_eof()
                got = answers(await read_frames(stream, 6))  # the answers, then end of stream
            nursery.cancel_scope.cancel()
    assert got == [(i, i) for i in range(5)]
    assert reasons(logs, "connection closed") == ["client closed"]


async def drained_tls_client(certs: Certs, *, send_more: bool, reply: bool) -> tuple[list, bytes | None]:
    """A TLS client whose connection corrfix ends with SIGTERM's drain, an answer still owed.

    ``send_more``: the client sends one more request after corrfix stopped reading, so that
    request sits unread in corrfix's socket. ``reply``: once it has read everything, the client
    answers corrfix's close_notify with its own (trio's ``aclose``) before it closes, rather
    than just close its socket.
    Returns the connection's close logs and the answer bytes, or None if the client's read
    failed (a reset, or an end of TCP stream without close_notify).
    """
    broker = FakeBroker()
    tls = TlsConfig(certfile=certs.server_cert, keyfile=certs.server_key)
    got: bytes | None = b""
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            upstream = await nursery.start(broker.serve)
            listen, broker_address = Address(LOOPBACK, 0), Address(LOOPBACK, upstream)
            proxy = Proxy(ProxyConfig(listen, broker_address, repair=FAST_REPAIR, tls=tls, close_linger=30))
            port = (await nursery.start(proxy.serve))[0].port
            with trio.fail_after(10):
                stream = await open_tls(port, client_context(certs))
                await stream.send_all(request_frame(ApiKey.LIST_OFFSETS, 7, 70))
                await wait_until(lambda: broker.requests)
                proxy.drain(timeout=30)
                if send_more:
                    await stream.send_all(request_frame(ApiKey.LIST_OFFSETS, 8, 80))
                try:
                    while data := await stream.receive_some(65536):  # ends at corrfix's close_notify
                        got += data
                except trio.BrokenResourceError:
                    got = None
                if reply:
                    await stream.aclose()
                else:  # as kafka-python does: the socket closed, no close_notify
                    await trio.aclose_forcefully(stream)
                # corrfix closes once the client ends, long before the 30 s linger is out.
                await wait_until(lambda: events(logs, "connection closed"))
            nursery.cancel_scope.cancel()
    kept_sending = events(logs, "client kept sending after the proxy's end of stream")
    return events(logs, "connection closed") + kept_sending, got


@pytest.mark.parametrize(("send_more", "reply"), [(True, False), (True, True), (False, True)])
async def test_a_drained_tls_client_gets_its_answer_then_close_notify(certs, send_more, reply):
    """TLS cannot half-close, so corrfix ends a TLS client's stream with close_notify and its TCP
    end of stream, then drops what the client still sends until it closes: closing the socket
    with those bytes unread would reset the connection and could destroy the answer."""
    closes, got = await drained_tls_client(certs, send_more=send_more, reply=reply)
    assert got is not None, "the client saw a reset or a TCP end without close_notify"
    assert answers(FrameDecoder().feed(got)) == [(7, 70)]
    assert [entry["event"] for entry in closes] == ["connection closed"]
    assert closes[0]["reason"] == "proxy draining"


# -- metrics from both relay paths at once ---------------------------------------------------


class ThreadCheckedRequests(dict):
    """A tally's requests by api that note any write from a thread other than the tally's."""

    def __init__(self, owner: int, strays: list[str]) -> None:
        super().__init__()
        self.owner, self.strays = owner, strays

    def __setitem__(self, key: int, value: int) -> None:
        if threading.get_ident() != self.owner:
            self.strays.append(threading.current_thread().name)
        super().__setitem__(key, value)


async def test_each_thread_counts_into_its_own_tally_with_both_paths_busy(certs, monkeypatch):
    """Without capture the repair machine counts each request and answer into the tally the
    sinks give it, and each tally has one writer, its own thread: plaintext connections are
    counted by the relay engine's thread, TLS ones by trio's, here both at once. Nothing may
    be counted twice, lost, or written from another thread."""
    strays: list[str] = []

    class ThreadCheckedTally(metrics_module.MetricTally):
        __slots__ = ("owner",)

        def __init__(self) -> None:
            super().__init__()
            self.owner = threading.get_ident()
            self.requests = ThreadCheckedRequests(self.owner, strays)

        def answer(self, api_key: int, seconds: float) -> None:
            if threading.get_ident() != self.owner:
                strays.append(threading.current_thread().name)
            super().answer(api_key, seconds)

    monkeypatch.setattr(metrics_module, "MetricTally", ThreadCheckedTally)
    metrics = ProxyMetrics()
    connections, batches, batch = 8, 4, 25

    async def client(port: int, context: ssl.SSLContext | None) -> None:
        stream: trio.abc.Stream
        if context is None:
            stream = await trio.open_tcp_stream(LOOPBACK, port)
        else:
            stream = await open_tls(port, context)
        for _ in range(batches):
            await stream.send_all(b"".join(request_frame(ApiKey.LIST_OFFSETS, i, i) for i in range(batch)))
            assert len(await read_frames(stream, batch)) == batch
        await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        broker_port = await nursery.start(FakeBroker().serve)
        ports = []
        for tls in (None, TlsConfig(certfile=certs.server_cert, keyfile=certs.server_key)):
            config = ProxyConfig(Address(LOOPBACK, 0), Address(LOOPBACK, broker_port), tls=tls)
            ports.append((await nursery.start(Proxy(config, metrics=metrics).serve))[0].port)
        plain_port, tls_port = ports
        with trio.fail_after(20):
            async with trio.open_nursery() as clients:
                for _ in range(connections):
                    clients.start_soon(client, plain_port, None)
                    clients.start_soon(client, tls_port, client_context(certs))
        nursery.cancel_scope.cancel()
    tallies = metrics._all_tallies()
    expected = 2 * connections * batches * batch
    assert len(tallies) == 2  # trio's thread and the engine's
    assert sum(sum(tally.requests.values()) for tally in tallies) == expected
    assert sum(sum(entry[1:]) for tally in tallies for entry in tally.answers.values()) == expected
    assert strays == []


# -- rotated certificates --------------------------------------------------------------------


def install(cert: Path, key: Path, directory: Path) -> None:
    """Put a certificate and its key where the proxy reads them, as a rotation does: each file
    written anew (a new inode), the key last."""
    for source, name in ((cert, "tls.crt"), (key, "tls.key")):
        fresh = directory / f".{name}.new"
        shutil.copyfile(source, fresh)
        fresh.replace(directory / name)


def der(cert: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert.read_text())


async def presented(port: int, certs: Certs) -> bytes:
    """The certificate a new TLS client is shown."""
    stream = await open_tls(port, client_context(certs))
    try:
        certificate = stream.getpeercert(binary_form=True)
        assert certificate is not None
        return certificate
    finally:
        await trio.aclose_forcefully(stream)


log = structlog.get_logger()


def test_rotated_files_are_loaded_once_they_have_held_still(certs, tmp_path):
    """A rotation is taken up once it has held still for ``settle`` seconds, however often the
    files are looked at: a certificate and its key are seldom replaced in one step."""
    install(certs.server_cert, certs.server_key, tmp_path)
    store = TlsContextStore(TlsConfig(certfile=tmp_path / "tls.crt", keyfile=tmp_path / "tls.key"))
    first = store.current
    with capture_logs() as logs:
        assert not store.check(log, 0.0, settle=10)  # nothing changed
        install(certs.next_server_cert, certs.next_server_key, tmp_path)
        assert not store.check(log, 1.0, settle=10)  # changed just now: it may still be changing
        assert not store.check(log, 10.9, settle=10)  # two watchers, say: still not 10 s
        assert store.current is first
        assert store.check(log, 11.0, settle=10)  # held still for 10 s: loaded
        assert store.current is not first and store.reloads == 1
        assert not store.check(log, 30.0, settle=10)  # and only once
    assert [entry["event"] for entry in logs] == ["TLS files reloaded"]


def test_a_change_while_settling_starts_the_wait_again(certs, tmp_path):
    install(certs.server_cert, certs.server_key, tmp_path)
    store = TlsContextStore(TlsConfig(certfile=tmp_path / "tls.crt", keyfile=tmp_path / "tls.key"))
    shutil.copyfile(certs.next_server_cert, tmp_path / "tls.crt")  # the certificate first...
    assert not store.check(log, 0.0, settle=10)
    install(certs.next_server_cert, certs.next_server_key, tmp_path)  # ...its key 8 s later
    assert not store.check(log, 8.0, settle=10)
    assert not store.check(log, 12.0, settle=10)  # 10 s after the first change, 4 after the last
    assert store.check(log, 18.0, settle=10) and store.failures == 0


def test_a_rotation_that_cannot_be_loaded_keeps_the_files_in_use(certs, tmp_path):
    install(certs.server_cert, certs.server_key, tmp_path)
    store = TlsContextStore(TlsConfig(certfile=tmp_path / "tls.crt", keyfile=tmp_path / "tls.key"))
    first = store.current
    with capture_logs() as logs:
        install(certs.next_server_cert, certs.server_key, tmp_path)  # the old key: not a pair
        assert not store.check(log, 0.0, settle=1) and not store.check(log, 1.0, settle=1)
        assert store.current is first and store.failing
        assert not store.check(log, 2.0, settle=1)  # tried again, and logged only once
        assert store.failures == 2
        install(certs.next_server_cert, certs.next_server_key, tmp_path)  # the key follows
        assert not store.check(log, 3.0, settle=1) and store.check(log, 4.0, settle=1)
        assert not store.failing
    failed = events(logs, "TLS files not reloaded: the ones loaded before stay in use")
    assert len(failed) == 1 and "--tls-cert" in failed[0]["error"]
    assert len(events(logs, "TLS files reloaded")) == 1


def test_files_that_failed_to_load_are_tried_again_until_they_load(certs, tmp_path, monkeypatch):
    """What fixes them may not change what stat shows: here, a descriptor freed."""
    install(certs.server_cert, certs.server_key, tmp_path)
    store = TlsContextStore(TlsConfig(certfile=tmp_path / "tls.crt", keyfile=tmp_path / "tls.key"))
    install(certs.next_server_cert, certs.next_server_key, tmp_path)

    def out_of_descriptors(context: ssl.SSLContext, certfile: Path, keyfile: Path | None = None) -> None:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    with capture_logs() as logs:
        with monkeypatch.context() as patched:
            patched.setattr(ssl.SSLContext, "load_cert_chain", out_of_descriptors)
            assert not store.check(log, 0.0, settle=1) and not store.check(log, 1.0, settle=1)
            assert store.failing
        assert store.check(log, 2.0, settle=1)  # nothing changed on disk: a retry, and it loads
    assert [entry["reason"] for entry in events(logs, "TLS files reloaded")] == ["retry"]


def test_a_file_removed_while_it_is_loaded_is_a_failed_load_not_a_crash(certs, tmp_path, monkeypatch):
    """A rotation under way can remove a file between its check and its load."""
    install(certs.server_cert, certs.server_key, tmp_path)
    config = TlsConfig(certfile=tmp_path / "tls.crt", keyfile=tmp_path / "tls.key")
    store = TlsContextStore(config)
    loading = ssl.SSLContext.load_cert_chain

    def removed_meanwhile(context: ssl.SSLContext, certfile: Path, keyfile: Path | None = None) -> None:
        certfile.unlink()
        loading(context, certfile, keyfile)

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", removed_meanwhile)
    with capture_logs() as logs:
        assert not store.reload(log)
    assert store.failing
    assert (
        "No such file"
        in events(logs, "TLS files not reloaded: the ones loaded before stay in use")[0]["error"]
    )


async def test_a_running_proxy_shows_new_clients_the_rotated_certificate(certs, tmp_path):
    """New connections get the rotated certificate without a restart; one already open keeps
    its session and goes on relaying."""
    install(certs.server_cert, certs.server_key, tmp_path)
    broker = FakeBroker()
    tls = TlsConfig(certfile=tmp_path / "tls.crt", keyfile=tmp_path / "tls.key")
    async with trio.open_nursery() as nursery:
        port = await start_proxy(nursery, await nursery.start(broker.serve), tls, tls_reload_interval=0.01)
        with trio.fail_after(10):
            assert await presented(port, certs) == der(certs.server_cert)
            open_before = await open_tls(port, client_context(certs))
            install(certs.next_server_cert, certs.next_server_key, tmp_path)
            await wait_until(lambda: tls_store(tls).reloads)
            assert await presented(port, certs) == der(certs.next_server_cert)
            assert await round_trip(open_before) == expected()
        nursery.cancel_scope.cancel()


async def test_a_rotation_that_cannot_be_loaded_shows_in_the_metrics(certs, tmp_path):
    """corrfix_tls_reload_failed is what an alert watches: the certificate in use will expire."""
    install(certs.server_cert, certs.server_key, tmp_path)
    tls = TlsConfig(certfile=tmp_path / "tls.crt", keyfile=tmp_path / "tls.key")
    metrics = ProxyMetrics()
    config = ProxyConfig(Address(LOOPBACK, 0), Address(LOOPBACK, 1), tls=tls, tls_reload_interval=0.01)
    store = tls_store(tls)

    def scraped() -> dict[str, float]:
        text = generate_latest(metrics.registry).decode()
        return {
            name: float(line.rpartition(" ")[2])
            for line in text.splitlines()
            for name in (
                "corrfix_tls_reload_failed",
                'corrfix_tls_reloads_total{result="loaded"}',
                'corrfix_tls_reloads_total{result="failed"}',
            )
            if line.startswith(name + " ")
        }

    async with trio.open_nursery() as nursery:
        await nursery.start(Proxy(config, metrics=metrics).serve)
        with trio.fail_after(10):
            install(certs.next_server_cert, certs.server_key, tmp_path)  # the old key: not a pair
            await wait_until(lambda: store.failing)
            failed = scraped()
            install(certs.next_server_cert, certs.next_server_key, tmp_path)
            await wait_until(lambda: store.reloads)
            loaded = scraped()
        nursery.cancel_scope.cancel()
    reloads = 'corrfix_tls_reloads_total{result="%s"}'
    assert failed == {"corrfix_tls_reload_failed": 1.0, reloads % "loaded": 0.0, reloads % "failed": 1.0}
    assert loaded == {"corrfix_tls_reload_failed": 0.0, reloads % "loaded": 1.0, reloads % "failed": 1.0}


async def test_sighup_loads_the_tls_files_at_once(certs, tmp_path):
    install(certs.server_cert, certs.server_key, tmp_path)
    broker = FakeBroker()
    tls = TlsConfig(certfile=tmp_path / "tls.crt", keyfile=tmp_path / "tls.key")
    config = ProxyConfig(
        Address(LOOPBACK, 0), Address(LOOPBACK, 1), repair=FAST_REPAIR, tls=tls, tls_reload_interval=0
    )
    async with trio.open_nursery() as nursery:
        broker_port = await nursery.start(broker.serve)
        proxy = Proxy(replace(config, upstream=Address(LOOPBACK, broker_port)))
        service = ProxyService(proxy, Liveness())
        port = (await nursery.start(proxy.serve))[0].port
        with trio.fail_after(10):
            install(certs.next_server_cert, certs.next_server_key, tmp_path)
            assert await presented(port, certs) == der(certs.server_cert)  # no watcher: not yet
            service.reload()  # what SIGHUP does
            assert await presented(port, certs) == der(certs.next_server_cert)
        nursery.cancel_scope.cancel()


class PeerNames:
    """An observer that only records the peers of each connection."""

    snaplen = 0

    def __init__(self) -> None:
        self.opened: list[tuple[str, str]] = []

    def connection_opened(self, connection: str, client: str, upstream: str) -> None:
        self.opened.append((client, upstream))

    def events(self, *args) -> None:
        pass

    def connection_closed(self, *args) -> None:
        pass


async def test_tls_on_both_sides_with_mutual_tls_to_the_broker(certs):
    broker = TlsFakeBroker(context=server_context(certs, require_client_cert=True))
    tls = TlsConfig(
        certfile=certs.server_cert,
        keyfile=certs.server_key,
        upstream_tls=True,
        upstream_cafile=certs.ca,
        upstream_server_hostname="localhost",
        upstream_certfile=certs.client_cert,
        upstream_keyfile=certs.client_key,
    )
    observer = PeerNames()
    async with trio.open_nursery() as nursery:
        broker_port = await nursery.start(broker.serve)
        config = ProxyConfig(
            Address(LOOPBACK, 0), Address(LOOPBACK, broker_port), repair=FAST_REPAIR, tls=tls
        )
        port = (await nursery.start(Proxy(config, observer=observer).serve))[0].port
        with trio.fail_after(10):
            streams = [await open_tls(port, client_context(certs)) for _ in range(3)]
            for stream in streams:
                assert await round_trip(stream, 50) == expected(50)
        nursery.cancel_scope.cancel()
    assert broker.server_names == ["localhost"] * 3
    assert broker.handshake_errors == []
    assert {upstream for _, upstream in observer.opened} == {f"{LOOPBACK}:{broker_port}"}
    assert all(client.startswith(f"{LOOPBACK}:") for client, _ in observer.opened)


async def test_mutual_tls_refuses_a_client_without_a_certificate(certs):
    broker = FakeBroker()
    tls = TlsConfig(certfile=certs.server_cert, keyfile=certs.server_key, client_ca=certs.ca)
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            port = await start_proxy(nursery, await nursery.start(broker.serve), tls)
            with trio.fail_after(10):
                anonymous = await trio.open_ssl_over_tcp_stream(
                    LOOPBACK, port, ssl_context=client_context(certs)
                )
                try:  # with TLS 1.3 the client learns of the refusal only when it next reads
                    await anonymous.do_handshake()
                    await anonymous.send_all(request_frame(ApiKey.LIST_OFFSETS, 1, 1))
                    assert await closed_by_peer(anonymous)
                except trio.BrokenResourceError:
                    pass
                assert broker.connections == 0  # refused before any upstream connection
                good = await open_tls(port, client_context(certs, with_cert=True))
                assert await round_trip(good) == expected()
            nursery.cancel_scope.cancel()
    failed = reasons(logs, "TLS handshake with client failed")
    assert len(failed) == 1 and "certificate" in failed[0].lower()
    assert broker.connections == 1


async def test_broker_certificate_name_is_checked_unless_told_not_to(certs):
    broker = TlsFakeBroker(context=server_context(certs))
    wrong_name = TlsConfig(
        upstream_tls=True, upstream_cafile=certs.ca, upstream_server_hostname="kafka.example"
    )
    unchecked = TlsConfig(
        upstream_tls=True,
        upstream_cafile=certs.ca,
        upstream_server_hostname="kafka.example",
        upstream_check_hostname=False,
    )
    untrusted = TlsConfig(upstream_tls=True, upstream_cafile=certs.other_ca)
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            broker_port = await nursery.start(broker.serve)
            refused = [await start_proxy(nursery, broker_port, tls) for tls in (wrong_name, untrusted)]
            accepted = await start_proxy(nursery, broker_port, unchecked)
            with trio.fail_after(10):
                for port in refused:
                    stream = await trio.open_tcp_stream(LOOPBACK, port)
                    await stream.send_all(request_frame(ApiKey.LIST_OFFSETS, 1, 1))
                    assert await closed_by_peer(stream)
                stream = await trio.open_tcp_stream(LOOPBACK, accepted)
                assert await round_trip(stream) == expected()
            nursery.cancel_scope.cancel()
    failed = reasons(logs, "TLS handshake with upstream failed")
    assert len(failed) == 2
    assert "certificate verify failed" in failed[0] and "kafka.example" in failed[0]
    assert "certificate verify failed" in failed[1]
    assert broker.server_names == ["kafka.example", None, "kafka.example"]  # an IP is never SNI


# -- the other protocol ------------------------------------------------------------------------


async def test_tls_client_on_a_plaintext_listener_is_named_and_closed(certs):
    broker = FakeBroker()
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            port = await start_proxy(nursery, await nursery.start(broker.serve), None)
            with trio.fail_after(10):
                stream = await trio.open_ssl_over_tcp_stream(
                    LOOPBACK, port, ssl_context=client_context(certs)
                )
                with pytest.raises(trio.BrokenResourceError):
                    await stream.do_handshake()
                good = await trio.open_tcp_stream(LOOPBACK, port)
                assert await round_trip(good) == expected()
            nursery.cancel_scope.cancel()
    closing = reasons(logs, "closing connection")
    assert len(closing) == 1 and closing[0].startswith("TLS handshake on a plaintext listener")
    assert "frame size" not in closing[0]


async def test_a_late_tls_looking_size_is_an_ordinary_bad_frame():
    """Only a connection's first bytes can be a ClientHello; later, 0x16 0x03 is just a bad size."""
    broker = FakeBroker()
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            port = await start_proxy(nursery, await nursery.start(broker.serve), None)
            with trio.fail_after(10):
                stream = await trio.open_tcp_stream(LOOPBACK, port)
                assert await round_trip(stream, 1) == expected(1)
                await stream.send_all(bytes.fromhex("16030100c8"))
                assert await closed_by_peer(stream)
            nursery.cancel_scope.cancel()
    closing = reasons(logs, "closing connection")
    assert len(closing) == 1 and closing[0].startswith("bad request from client: frame size")


async def test_plaintext_client_on_a_tls_listener_is_named_and_closed(certs):
    broker = FakeBroker()
    tls = TlsConfig(certfile=certs.server_cert, keyfile=certs.server_key)
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            broker_port = await nursery.start(broker.serve)
            port = await start_proxy(nursery, broker_port, tls, connect_timeout=HANDSHAKE_TIMEOUT)
            with trio.fail_after(10):
                plaintext = await trio.open_tcp_stream(LOOPBACK, port)
                await plaintext.send_all(request_frame(ApiKey.LIST_OFFSETS, 1, 1))
                assert await closed_by_peer(plaintext)  # reset: the peeked bytes were never read
                silent = await trio.open_tcp_stream(LOOPBACK, port)  # connects, never speaks
                assert await closed_by_peer(silent)
                good = await open_tls(port, client_context(certs))
                assert await round_trip(good) == expected()
            nursery.cancel_scope.cancel()
    failed = reasons(logs, "TLS handshake with client failed")
    assert len(failed) == 2
    assert failed[0].startswith("not a TLS handshake (first byte 0x00)")
    assert failed[1] == f"no TLS handshake within {HANDSHAKE_TIMEOUT:g}s"
    assert broker.connections == 1  # only the good client got an upstream connection


async def test_plaintext_broker_behind_upstream_tls_is_named(certs):
    """A Kafka broker reads a ClientHello as a 369 MB frame: it closes (Apache Kafka) or waits."""

    async def closing_broker(stream: trio.SocketStream) -> None:
        try:
            while data := await stream.receive_some(65536):
                FrameDecoder().feed(data)
        except ProtocolError:
            await stream.aclose()

    async def waiting_broker(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    tls = TlsConfig(upstream_tls=True, upstream_cafile=certs.ca)
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            ports = []
            for handler in (closing_broker, waiting_broker):
                listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host=LOOPBACK))
                broker_port = listeners[0].socket.getsockname()[1]
                ports.append(await start_proxy(nursery, broker_port, tls, connect_timeout=HANDSHAKE_TIMEOUT))
            with trio.fail_after(10):
                for port in ports:
                    stream = await trio.open_tcp_stream(LOOPBACK, port)
                    await stream.send_all(request_frame(ApiKey.LIST_OFFSETS, 1, 1))
                    assert await closed_by_peer(stream)
            nursery.cancel_scope.cancel()
    failed = reasons(logs, "TLS handshake with upstream failed")
    assert len(failed) == 2
    assert failed[0].startswith("the broker closed the connection during the TLS handshake")
    assert failed[1].startswith(f"no TLS handshake answer within {HANDSHAKE_TIMEOUT:g}s")
    assert all("plaintext listener? (drop --upstream-tls)" in reason for reason in failed)


async def test_a_bootstrap_broker_that_fails_the_handshake_is_passed_over_for_the_next(certs):
    """With ``--upstream BAD,GOOD``, a first broker that accepted TCP and then failed the TLS
    handshake closed the client, though the next broker would have served it; and, taken for
    the broker that last accepted, it was tried first by every connection after."""

    async def closing_broker(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)  # the ClientHello, read as a Kafka frame too big to take
        await stream.aclose()

    broker = TlsFakeBroker(context=server_context(certs))
    tls = TlsConfig(upstream_tls=True, upstream_cafile=certs.ca)
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            serve = functools.partial(trio.serve_tcp, closing_broker, 0, host=LOOPBACK)
            listeners = await nursery.start(serve)
            bad = Address(LOOPBACK, listeners[0].socket.getsockname()[1])
            good = Address(LOOPBACK, await nursery.start(broker.serve))
            config = ProxyConfig(
                Address(LOOPBACK, 0), bad, fallback_upstreams=(good,), repair=FAST_REPAIR, tls=tls
            )
            port = (await nursery.start(Proxy(config).serve))[0].port
            with trio.fail_after(10):
                for _ in range(2):
                    stream = await trio.open_tcp_stream(LOOPBACK, port)
                    assert await round_trip(stream) == expected()
                    await stream.aclose()
            nursery.cancel_scope.cancel()
    assert len(reasons(logs, "TLS handshake with upstream failed")) == 1  # the second starts at GOOD
    assert [entry["upstream"] for entry in events(logs, "connection opened")] == [str(good)] * 2


async def test_a_cancelled_upstream_handshake_closes_the_broker_socket(certs):
    """The proxy stopping while a broker has not answered the ClientHello: the socket is
    closed then, not left to the garbage collector."""
    hello_sent = trio.Event()

    async def silent_broker(stream: trio.SocketStream) -> None:
        await stream.receive_some(1)
        hello_sent.set()
        await trio.sleep_forever()

    async def stop_once_the_hello_is_sent() -> None:
        await hello_sent.wait()
        handshake.cancel()

    tls = TlsConfig(upstream_tls=True, upstream_cafile=certs.ca)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, silent_broker, 0, host=LOOPBACK))
        stream = await trio.open_tcp_stream(LOOPBACK, listeners[0].socket.getsockname()[1])
        with trio.CancelScope() as handshake:
            nursery.start_soon(stop_once_the_hello_is_sent)
            await connect_upstream(stream, tls, LOOPBACK, 60, structlog.get_logger())
        assert handshake.cancelled_caught
        assert stream.socket.fileno() == -1
        nursery.cancel_scope.cancel()


async def test_tls_broker_without_upstream_tls_is_named(certs):
    """A JVM broker answers plaintext with a TLS alert (a 352 MB "frame"); OpenSSL just closes."""

    async def alerting_broker(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await stream.send_all(JAVA_STYLE_ALERT)
        await stream.aclose()

    openssl_broker = TlsFakeBroker(context=server_context(certs))
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                functools.partial(trio.serve_tcp, alerting_broker, 0, host=LOOPBACK)
            )
            alerting_port = await start_proxy(nursery, listeners[0].socket.getsockname()[1], None)
            openssl_port = await start_proxy(nursery, await nursery.start(openssl_broker.serve), None)
            with trio.fail_after(10):
                for port in (alerting_port, openssl_port):
                    stream = await trio.open_tcp_stream(LOOPBACK, port)
                    await stream.send_all(request_frame(ApiKey.LIST_OFFSETS, 1, 1))
                    assert await closed_by_peer(stream)
            nursery.cancel_scope.cancel()
    closing = reasons(logs, "closing connection")
    assert closing == [
        "the broker answered with a TLS record: it is a TLS listener (start corrfix with --upstream-tls)"
    ]
    hints = [e["hint"] for e in events(logs, "upstream closed before answering anything")]
    assert hints == ["if the broker is a TLS listener, start corrfix with --upstream-tls"]
    assert len(openssl_broker.handshake_errors) == 1


async def test_a_broker_that_answered_plaintext_gets_no_tls_hint_when_it_resets():
    """Tansu resets a connection after a request it rejects (kcat's Produce v0): once a
    broker has answered plaintext on any connection, its closes are not a TLS listener."""
    calls = iter(["answer", "close"])
    broker = FakeBroker(lambda _index, _api_key: next(calls))
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            port = await start_proxy(nursery, await nursery.start(broker.serve), None)
            with trio.fail_after(10):
                for cid in (1, 2):
                    stream = await trio.open_tcp_stream(LOOPBACK, port)
                    await stream.send_all(request_frame(ApiKey.LIST_OFFSETS, cid, cid))
                    got = await read_frames(stream, 1)
                    assert len(got) == (1 if cid == 1 else 0)
                    await stream.aclose()
            nursery.cancel_scope.cancel()
    assert events(logs, "upstream closed before answering anything") == []
    assert len(events(logs, "upstream closed before answering anything on this connection")) == 1


# -- configuration -----------------------------------------------------------------------------


def parse(*options: str | Path):
    argv = ["proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9092", *map(str, options)]
    return build_parser().parse_args(argv)


def test_no_tls_options_mean_plaintext_both_ways():
    assert tls_config_from_args(parse()) is None
    assert proxy_config_from_args(parse()).tls is None


def test_options_become_a_tls_config(certs):
    args = parse(
        "--tls-cert", certs.server_cert, "--tls-key", certs.server_key, "--tls-client-ca", certs.ca,
        "--upstream-tls", "--upstream-ca", certs.ca, "--upstream-server-name", "kafka.example",
        "--upstream-cert", certs.client_cert, "--upstream-key", certs.client_key,
        "--upstream-no-check-hostname",
    )  # fmt: skip
    assert proxy_config_from_args(args).tls == TlsConfig(
        certfile=certs.server_cert,
        keyfile=certs.server_key,
        client_ca=certs.ca,
        upstream_tls=True,
        upstream_cafile=certs.ca,
        upstream_server_hostname="kafka.example",
        upstream_certfile=certs.client_cert,
        upstream_keyfile=certs.client_key,
        upstream_check_hostname=False,
    )
    assert tls_config_from_args(parse("--upstream-tls")) == TlsConfig(upstream_tls=True)


def test_tls_settings_from_a_config_file(certs, tmp_path):
    file = tmp_path / "tls.toml"
    file.write_text(
        f'listen = "127.0.0.1:0"\nupstream = "127.0.0.1:9092"\ntls-cert = "{certs.server_cert}"\n'
        f'tls-key = "{certs.server_key}"\nupstream-tls = true\nupstream-ca = "{certs.ca}"\n'
        "upstream-check-hostname = false\n"  # like rewrite = false for --no-rewrite: the setting's name
    )
    parser = build_parser()
    argv = ["proxy", "--config", str(file)]
    args = _with_config_file(parser, parser.parse_args(argv), argv)
    assert proxy_config_from_args(args).tls == TlsConfig(
        certfile=certs.server_cert,
        keyfile=certs.server_key,
        upstream_tls=True,
        upstream_cafile=certs.ca,
        upstream_check_hostname=False,
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--tls-cert", "missing.pem"], r"--tls-cert missing\.pem: does not exist"),
        (["--tls-cert", "{dir}"], r"--tls-cert .*: is not a file"),
        (["--tls-cert", "{garbage}"], r"--tls-cert .*: not a usable PEM certificate and matching key"),
        (["--tls-cert", "{server_cert}", "--tls-key", "{client_key}"], r"--tls-key .*: not a usable PEM"),
        (["--tls-cert", "{server_cert}"], r"not a usable PEM certificate and matching key"),  # key missing
        (["--tls-key", "{server_key}"], r"--tls-key needs --tls-cert"),
        (["--tls-client-ca", "{ca}"], r"--tls-client-ca needs --tls-cert"),
        (["--upstream-ca", "{ca}"], r"--upstream-ca needs --upstream-tls"),
        (["--upstream-no-check-hostname"], r"--upstream-no-check-hostname needs --upstream-tls"),
        (["--upstream-tls", "--upstream-key", "{client_key}"], r"--upstream-key needs --upstream-cert"),
        (["--upstream-tls", "--upstream-ca", "{garbage}"], r"--upstream-ca .*: not a PEM CA bundle"),
        (["--upstream-tls", "--upstream-cert", "nope.pem"], r"--upstream-cert nope\.pem: does not exist"),
    ],
)
def test_unusable_settings_are_named_at_startup(certs, tmp_path, options, message):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    names = {
        "dir": tmp_path,
        "garbage": garbage,
        "ca": certs.ca,
        "server_cert": certs.server_cert,
        "server_key": certs.server_key,
        "client_key": certs.client_key,
    }
    with pytest.raises(TlsError, match=message):
        tls_config_from_args(parse(*(option.format(**names) for option in options)))


def test_the_command_refuses_to_start_with_a_missing_certificate(tmp_path):
    missing = tmp_path / "missing.pem"
    command = ["-m", "corrfix", "proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1"]
    result = subprocess.run(
        [sys.executable, *command, "--tls-cert", str(missing)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "cannot start" in result.stderr and f"--tls-cert {missing}: does not exist" in result.stderr


# -- real clients ------------------------------------------------------------------------------


async def test_real_clients_over_tls_through_corrfix_to_plaintext_tansu(certs, tansu):
    n = 500
    tls = TlsConfig(certfile=certs.server_cert, keyfile=certs.server_key)
    kafka_python_tls = {"security_protocol": "SSL", "ssl_cafile": str(certs.ca)}
    confluent_tls = {"security.protocol": "SSL", "ssl.ca.location": str(certs.ca)}
    await trio.to_thread.run_sync(clients.create_topic, tansu.bootstrap, "tls", 2)
    async with trio.open_nursery() as nursery:
        proxy = Proxy(ProxyConfig(Address(LOOPBACK, 0), Address(LOOPBACK, tansu.port), tls=tls))
        bootstrap = f"{LOOPBACK}:{(await nursery.start(proxy.serve))[0].port}"

        async def in_thread(fn, *args, **kwargs):
            return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

        with trio.fail_after(120):
            produced = await in_thread(
                clients.produce_kafka_python, bootstrap, "tls", n, acks="all", config=kafka_python_tls
            )
            by_kafka_python = await in_thread(
                clients.consume_all, bootstrap, "tls", n, client="kafka-python", config=kafka_python_tls
            )
            by_confluent = await in_thread(clients.consume_all, bootstrap, "tls", n, config=confluent_tls)
        nursery.cancel_scope.cancel()
    assert produced.ok, produced
    assert sorted(by_kafka_python) == clients.expected_values(n)
    assert sorted(by_confluent) == clients.expected_values(n)
    assert proxy.stats.connections_opened >= 3  # bootstrap and broker connections, all over TLS
