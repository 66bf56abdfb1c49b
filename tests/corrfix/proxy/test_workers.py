"""The supervisor's side of ``--workers``: where each worker says it serves, which endpoint a
worker serves, and the supervisor's health while a worker starts or has drained."""

from __future__ import annotations

import os
import socketserver
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from corrfix.core import Address
from corrfix.proxy._admin import AdminApp, AdminServer
from corrfix.proxy._health import Verdict
from corrfix.proxy._systemd import READY, endpoint, notify
from corrfix.proxy._workers import (
    OWN_ENDPOINT,
    WORKER_ENDPOINT_VARIABLE,
    Slot,
    SummedWorkerMetrics,
    WorkerNotifications,
    WorkersHealth,
    endpoints_to_serve,
    overdue,
)

METRICS, ADMIN = Address("0.0.0.0", 9100), Address("127.0.0.1", 9101)


HARNESS_TIMEOUT = 60
"""A hang guard for one run of the stand-in supervisor (they take a few seconds)."""


def test_a_worker_s_endpoint_is_read_from_its_ready_message_and_bad_ones_are_skipped():
    notifications = WorkerNotifications()
    try:
        environment = notifications.worker_environment()
        me = os.getpid()
        assert notify("X_CORRFIX_ENDPOINT=not an address", environment)
        assert notify(f"{READY}\n{endpoint(Address('127.0.0.1', 4321))}", environment)
        assert notifications.wait_ready(5.0, {me})  # the kernel names the sender
        assert notifications.endpoints == {me: Address("127.0.0.1", 4321)}
        assert notifications.said_ready(me)
        assert notify(f"{READY}\n{endpoint(Address('127.0.0.1', 4322))}", environment)  # a reload
        notifications.wait_ready(5.0, {me})
        assert notifications.endpoints == {me: Address("127.0.0.1", 4322)}
    finally:
        notifications.close()


def test_a_worker_that_exited_is_forgotten_and_its_late_messages_dropped():
    notifications = WorkerNotifications()
    try:
        environment = notifications.worker_environment()
        me = os.getpid()
        assert notify(f"{READY}\n{endpoint(Address('127.0.0.1', 4321))}", environment)
        notifications.wait_ready(5.0, {me})
        notifications.forget(me)  # its pid may come back as another process's
        assert notifications.endpoints == {} and not notifications.said_ready(me)
        assert notify(f"{READY}\n{endpoint(Address('127.0.0.1', 4321))}", environment)
        notifications.wait_ready(5.0, {me + 1})  # read while the exited pid is no worker's
        assert notifications.endpoints == {} and not notifications.said_ready(me)
    finally:
        notifications.close()


def test_the_workers_notify_the_supervisor_without_a_temporary_directory(monkeypatch, tmp_path):
    """Their notify socket was a file in a directory made under /tmp: on a read-only root file
    system (the Kubernetes example's) ``--workers`` died of a traceback as it started."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "absent"))
    notifications = WorkerNotifications()
    try:
        assert notify(READY, notifications.worker_environment())
        assert notifications.wait_ready(5.0, {os.getpid()})
    finally:
        notifications.close()


def test_a_worker_serves_one_endpoint_of_its_own_whatever_the_user_asked():
    notifications = WorkerNotifications()
    try:
        metrics_worker = notifications.worker_environment("metrics")
        admin_worker = notifications.worker_environment("admin")
        plain_worker = notifications.worker_environment()
    finally:
        notifications.close()
    assert endpoints_to_serve(METRICS, ADMIN, metrics_worker) == (OWN_ENDPOINT, None)
    assert endpoints_to_serve(METRICS, ADMIN, admin_worker) == (None, OWN_ENDPOINT)
    assert WORKER_ENDPOINT_VARIABLE not in plain_worker
    assert endpoints_to_serve(METRICS, ADMIN, {}) == (METRICS, ADMIN)  # not a worker


def test_a_worker_that_does_not_say_ready_in_time_is_overdue():
    started, ready = [100.0, 100.0, 150.0], [True, False, False]
    assert overdue(started, ready, now=161.0, timeout=60.0) == [1]
    assert overdue(started, ready, now=159.0, timeout=60.0) == []
    assert overdue(started, ready, now=211.0, timeout=60.0) == [1, 2]


def test_a_worker_starting_or_drained_keeps_the_supervisor_live_but_not_ready():
    health = WorkersHealth(["starting", "exited"])
    live, ready = health.live(), health.ready()
    assert live.ok and [answer["state"] for answer in live.detail["live"]] == ["starting", "exited"]
    assert not ready.ok and ready.detail["workers"][0]["error"] == "starting: no endpoint"


def test_a_worker_that_does_not_answer_makes_the_supervisor_not_live():
    with_a_closed_port = WorkersHealth([Address("127.0.0.1", 1)])
    assert not with_a_closed_port.live().ok


def run_harness(mode: str) -> str:
    """The supervisor with stand-in workers (tests/support/workers_harness.py); its output."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.support.workers_harness", mode],
            capture_output=True,
            text=True,
            timeout=HARNESS_TIMEOUT,
            cwd=Path(__file__).parents[3],
        )
    except subprocess.TimeoutExpired as exc:  # the child is killed by run()
        raise AssertionError(f"the supervisor did not stop: {exc.stdout!r}") from None
    return done.stdout + done.stderr


def test_a_stop_signal_that_comes_while_a_worker_is_restarted_reaches_it():
    """SIGTERM while a dead worker's replacement starts: the replacement missed it, and the
    supervisor waited for it until a second signal. It is told once it has started. Dying of
    it before it handles signals is stopping as asked: the supervisor exited 15 for it."""
    out = run_harness("race")  # the replacement may die of the signal before it handles any
    assert "workers stopped" in out and "2 starts" in out, out
    assert "returned 0 after" in out, out


def test_occasional_worker_deaths_are_restarted_and_a_crash_loop_stops_the_proxy():
    """Restarts are limited within a window: deaths spread out are restarted for as long as
    they come (here 14, past the 10 a lifetime limit allowed), a crash loop stops the proxy."""
    occasional = run_harness("occasional")
    assert "keeps dying" not in occasional and "15 starts" in occasional, occasional
    loop = run_harness("loop")
    assert "keeps dying" in loop, loop


def test_a_worker_that_cannot_be_made_is_tried_again_and_none_at_all_stops_the_proxy():
    """fork failing (out of memory or process slots) raised out of the supervisor: the
    workers already running were left without it, undrained. A restart is tried again on
    the next pass; a proxy whose first workers cannot be made stops, with status 2."""
    out = run_harness("refused")
    assert "cannot start a worker" in out and "3 starts" in out, out
    assert "returned 0 after" in out and "Traceback" not in out, out
    out = run_harness("nofork")
    assert "cannot start a worker" in out and "returned 2 after" in out, out
    assert "Traceback" not in out, out


def test_sighup_spares_a_worker_still_starting():
    """A worker handles signals once trio runs: until it says READY=1, SIGHUP's default action
    would kill it (and cost a restart). It opens its files anew anyway, so it is not sent one.
    Nor is systemd told of a reload then: its READY=1 came before any worker listened."""
    out = run_harness("sighup")
    assert "restarting" not in out and "returncodes=[0]" in out, out
    assert "told systemd ['READY=1', 'STOPPING=1']" in out, out


class _DiesMidAnswer(socketserver.StreamRequestHandler):
    """A worker's endpoint killed while answering: fewer bytes than its Content-Length."""

    def handle(self) -> None:
        self.rfile.readline()
        body = b"# TYPE x_total counter\nx_total 1.0\n"
        self.wfile.write(b"HTTP/1.0 200 OK\r\nContent-Length: 10000\r\n\r\n" + body)


def test_a_worker_dying_mid_answer_costs_only_its_own_metrics_and_health():
    """http.client's short read is no OSError: it failed the whole scrape (500), and every
    healthy worker's samples with it. The others are still served, and the dying one counts
    as not answering."""
    registry = CollectorRegistry()
    Counter("corrfix_good", "a healthy worker's counter", registry=registry).inc(5)
    good = AdminServer(
        Address("127.0.0.1", 0), AdminApp(lambda: Verdict(True, {}), lambda: Verdict(True, {}), registry)
    )
    dying = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _DiesMidAnswer)
    threading.Thread(target=dying.serve_forever, daemon=True).start()
    try:
        endpoints: list[Slot] = [good.address, Address("127.0.0.1", dying.server_address[1])]
        summed = CollectorRegistry()
        summed.register(SummedWorkerMetrics(endpoints))
        assert summed.get_sample_value("corrfix_good_total") == 5
        answers = WorkersHealth(endpoints).live().detail["live"]
        assert [a["status"] for a in answers] == [200, None]
        assert "IncompleteRead" in answers[1]["error"]
    finally:
        good.close()
        dying.shutdown()
        dying.server_close()


def worker_metrics(opened: int, active: int, port: int = 0) -> AdminServer:
    """A worker's own endpoint with a counter and a gauge."""
    registry = CollectorRegistry()
    Counter("corrfix_connections_opened", "Client connections accepted", registry=registry).inc(opened)
    Gauge("corrfix_connections_active", "Client connections open", registry=registry).set(active)
    return AdminServer(
        Address("127.0.0.1", port), AdminApp(lambda: Verdict(True, {}), lambda: Verdict(True, {}), registry)
    )


def test_summed_counters_never_go_down_when_a_worker_misses_a_scrape_or_restarts():
    """Prometheus takes a counter that went down for one reset to zero: increase() counted the
    whole sum again when a worker did not answer a scrape, or restarted from zero. The sum
    keeps what such a worker counted; gauges are only the answering workers' own, each with its
    worker's index."""
    first, second = worker_metrics(opened=5, active=2), worker_metrics(opened=3, active=1)
    restarted = None
    endpoints: list[Slot] = [first.address, second.address]
    summed = CollectorRegistry()
    summed.register(SummedWorkerMetrics(endpoints))

    def scrape() -> tuple[float | None, list[float | None]]:
        active = [summed.get_sample_value("corrfix_connections_active", {"worker": w}) for w in "01"]
        return summed.get_sample_value("corrfix_connections_opened_total"), active

    try:
        assert scrape() == (8, [2, 1])
        second.close()  # dead, or too busy to answer in time
        assert scrape() == (8, [2, None])
        endpoints[1] = "starting"
        assert scrape() == (8, [2, None])
        restarted = worker_metrics(opened=1, active=1)
        endpoints[1] = restarted.address
        assert scrape() == (9, [2, 1])
        first.close()  # its replacement takes the same port before the next scrape
        first = worker_metrics(opened=2, active=0, port=first.address.port)
        assert scrape() == (11, [0, 1])
    finally:
        first.close()
        if restarted is not None:
            restarted.close()


def test_gauges_are_per_worker_so_one_worker_s_trouble_is_not_averaged_away():
    """Summed, one worker that could not reach a broker showed ``corrfix_upstream_up`` 1 of 2
    workers, so ``corrfix_upstream_up == 0`` never fired; and one worker at its
    ``--max-connections`` beside an idle one read as half full. Gauges keep their own labels
    and gain the worker's index; counters are still one sum."""
    workers = []
    for opened, active, up in ((7, 95, 1), (2, 10, 0)):
        registry = CollectorRegistry()
        Counter("corrfix_connections_opened", "accepted", registry=registry).inc(opened)
        Gauge("corrfix_connections_active", "open", registry=registry).set(active)
        Gauge("corrfix_connections_max", "limit", registry=registry).set(100)
        Gauge("corrfix_upstream_up", "up", ["upstream"], registry=registry).labels("10.0.0.1:9092").set(up)
        workers.append(
            AdminServer(
                Address("127.0.0.1", 0),
                AdminApp(lambda: Verdict(True, {}), lambda: Verdict(True, {}), registry),
            )
        )
    try:
        summed = CollectorRegistry()
        summed.register(SummedWorkerMetrics([worker.address for worker in workers]))
        value = summed.get_sample_value
        up = [value("corrfix_upstream_up", {"upstream": "10.0.0.1:9092", "worker": w}) for w in "01"]
        assert up == [1, 0]
        assert [value("corrfix_connections_active", {"worker": w}) for w in "01"] == [95, 10]
        assert [value("corrfix_connections_max", {"worker": w}) for w in "01"] == [100, 100]
        assert value("corrfix_connections_active") is None  # no unlabelled sum beside them
        assert value("corrfix_connections_opened_total") == 9
    finally:
        for worker in workers:
            worker.close()


class _AnswersOnceAllAsked(socketserver.StreamRequestHandler):
    """A worker's endpoint that answers only once every worker has been asked."""

    asked: threading.Barrier

    def handle(self) -> None:
        self.rfile.readline()
        try:
            self.asked.wait(timeout=5)
        except threading.BrokenBarrierError:
            return  # asked one at a time: no answer, as from a hung worker
        body = b'{"live": true}'
        head = f"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        self.wfile.write(head.encode() + body)


def test_the_supervisor_asks_its_workers_at_once(monkeypatch):
    """Asked one after the other, every worker that hung cost the supervisor's ``/livez`` one
    scrape timeout: three hung workers took longer than a probe waits. Every worker is asked
    at once; here each answers only when all of them have been asked."""
    monkeypatch.setattr("corrfix.proxy._workers.SCRAPE_TIMEOUT", 1.0)
    handler = type("Handler", (_AnswersOnceAllAsked,), {"asked": threading.Barrier(3)})
    servers = [socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler) for _ in range(3)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        health = WorkersHealth([Address("127.0.0.1", server.server_address[1]) for server in servers])
        live = health.live()
        assert live.ok, live.detail
        assert [answer["worker"] for answer in live.detail["live"]] == [0, 1, 2]
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
