"""/livez, /readyz and /metrics of a real ``corrfix proxy`` process, while Tansu is up,
stopped, restarted, and while the proxy drains; and of ``--workers``."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from corrfix._netutil import free_port, free_ports
from corrfix.core import Address
from corrfix.lab import CorrfixProcess, workload
from corrfix.proxy._admin import AdminApp, AdminServer
from corrfix.proxy._health import Verdict
from tests.support.health import held_fetch, probe, wait_for, wait_for_draining, wait_for_status

pytestmark = pytest.mark.broker
HOLD_MS = 5000
"""How long Tansu holds the Fetch that keeps a drain going."""


def proxy_args(port: int, upstream: str, *extra: str) -> list[str]:
    return [
        "proxy",
        "--listen",
        f"127.0.0.1:{port}",
        "--upstream",
        upstream,
        "--ready-interval",
        "0.1",
        "--ready-stale",
        "0.5",
        *extra,
    ]


def test_probes_follow_tansu_up_stopped_restarted_and_the_drain(tansu_factory, tmp_path):
    port, metrics_port = free_ports(2)
    broker = tansu_factory(advertised_port=port)
    base = f"http://127.0.0.1:{metrics_port}"
    args = proxy_args(
        port, broker.bootstrap, "--metrics", f"127.0.0.1:{metrics_port}", "--drain-timeout", "20"
    )
    with CorrfixProcess(args, port, tmp_path / "p.log") as proxy:
        assert wait_for_status(f"{base}/readyz", 200)["upstreams"][0]["upstream"] == broker.bootstrap
        assert probe(f"{base}/livez") == (200, {"live": True})
        scraped = scrape(base)
        assert f'corrfix_upstream_up{{upstream="{broker.bootstrap}"}} 1.0' in scraped
        assert "corrfix_ready 1.0" in scraped and "corrfix_connections_max 10000.0" in scraped

        broker.stop()
        body = wait_for_status(f"{base}/readyz", 503)
        (reason,) = body["reasons"]
        assert reason.startswith(f"{broker.bootstrap}: no ApiVersions answer for ")
        assert "Connection refused" in reason
        assert probe(f"{base}/livez")[0] == 200
        assert f'corrfix_upstream_up{{upstream="{broker.bootstrap}"}} 0.0' in scrape(base)

        broker = tansu_factory(advertised_port=port, port=broker.port)
        wait_for_status(f"{base}/readyz", 200)

        # A Fetch that Tansu holds for 5 s keeps the drain going: meanwhile, not ready, still live.
        # (The checks below must all happen inside that hold, on a machine that may be busy.)
        workload.create_topic(f"127.0.0.1:{port}", "idle")
        with held_fetch(("127.0.0.1", port), "idle", HOLD_MS) as client:
            wait_for_outstanding(base)
            proxy._proc.send_signal(signal.SIGTERM)
            body = wait_for_draining(base)
            assert body["reasons"][0] == "draining: the proxy takes no new connections"
            assert probe(f"{base}/livez")[0] == 200
            assert proxy._proc.poll() is None  # still draining
            assert len(client.recv(1 << 16)) > 8  # the Fetch answer was still delivered
        assert proxy._proc.wait(20) == 0
    events = [record["event"] for record in proxy.records()]
    # the failure while Tansu was stopped (its reason is checked above), then the recovery; a
    # loaded machine may add a late check's failure, so the count is not the point
    failed = events.index("upstream check failed")
    assert "upstream answers again" in events[failed:]


def wait_for_outstanding(base: str) -> None:
    """Until the proxy has read the held Fetch and awaits its answer (in one of the workers'
    gauges with ``--workers``)."""

    def outstanding() -> float:
        families = text_string_to_metric_families(scrape(base))
        return sum(s.value for f in families if f.name == "corrfix_outstanding_requests" for s in f.samples)

    wait_for(lambda: outstanding() == 1, 10, "the Fetch to be outstanding")


def scrape(base: str) -> str:
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
        return response.read().decode()


def test_admin_serves_health_without_metrics(tansu, tmp_path):
    port, admin_port = free_ports(2)
    base = f"http://127.0.0.1:{admin_port}"
    args = proxy_args(port, tansu.bootstrap, "--admin", f"127.0.0.1:{admin_port}")
    with CorrfixProcess(args, port, tmp_path / "a.log"):
        wait_for_status(f"{base}/readyz", 200)
        assert probe(f"{base}/livez") == (200, {"live": True})
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{base}/metrics", timeout=5)
        assert info.value.code == 404 and info.value.read() == b"try /livez /readyz\n"


def both_ready(metrics: str) -> bool:
    """Each of two workers' ``corrfix_ready`` is 1 in the supervisor's scrape."""
    return all(f'corrfix_ready{{worker="{index}"}} 1.0' in metrics for index in range(2))


@contextlib.contextmanager
def two_workers(
    upstream: str, log_path: Path, *, admin: bool = False
) -> Iterator[tuple[CorrfixProcess, int, str, str]]:
    """``--workers 2 --metrics`` (and ``--admin``), once both workers are ready: the process,
    its port, the metrics base URL and the admin one (empty without ``--admin``)."""
    port, metrics_port, admin_port = free_ports(3)
    base, admin_base = f"http://127.0.0.1:{metrics_port}", f"http://127.0.0.1:{admin_port}" if admin else ""
    extra = ["--admin", f"127.0.0.1:{admin_port}"] if admin else []
    args = proxy_args(port, upstream, "--workers", "2", "--metrics", f"127.0.0.1:{metrics_port}", *extra)
    with CorrfixProcess(args, port, log_path) as proxy:
        body = wait_for_status(f"{base}/readyz", 200)
        assert [worker["status"] for worker in body["workers"]] == [200, 200]
        assert body["workers"][0]["detail"]["upstreams"][0]["upstream"] == upstream
        yield proxy, port, base, admin_base


def test_workers_answer_for_every_worker_and_turn_unready_on_sigterm(tansu, tmp_path):
    with two_workers(tansu.bootstrap, tmp_path / "w.log") as (proxy, port, base, _):
        live = probe(f"{base}/livez")
        assert live[0] == 200 and [w["status"] for w in live[1]["live"]] == [200, 200]
        wait_for(lambda: both_ready(scrape(base)), 10, "both workers ready in /metrics")
        workload.create_topic(f"127.0.0.1:{port}", "idle")
        with held_fetch(("127.0.0.1", port), "idle", HOLD_MS) as client:
            wait_for_outstanding(base)
            proxy._proc.send_signal(signal.SIGTERM)
            wait_for_draining(base)
            assert len(client.recv(1 << 16)) > 8
        assert proxy._proc.wait(20) == 0


def test_a_restarted_worker_is_asked_where_it_now_serves(tansu, tmp_path):
    with two_workers(tansu.bootstrap, tmp_path / "w.log") as (proxy, _, base, _):
        workers = next(r for r in proxy.records() if r["event"] == "workers started")["pids"]
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)
        wait_for(
            lambda: any(r["event"] == "worker exited, restarting" for r in proxy.records()),
            20,
            "the supervisor to restart the killed worker",
        )
        # The old worker is gone and its port closed: only the new one, at the port the kernel
        # gave it, can answer for worker 0.
        body = wait_for_status(f"{base}/readyz", 200)
        assert [worker["status"] for worker in body["workers"]] == [200, 200]
        wait_for(lambda: both_ready(scrape(base)), 10, "both workers ready in /metrics")


def test_workers_leave_the_admin_and_metrics_addresses_to_the_supervisor(tansu, tmp_path):
    with two_workers(tansu.bootstrap, tmp_path / "w.log", admin=True) as (proxy, _, _, admin_base):
        body = wait_for_status(f"{admin_base}/readyz", 200)
        assert [worker["status"] for worker in body["workers"]] == [200, 200]
        assert not any(r["event"] == "worker exited, restarting" for r in proxy.records())


HANG_FIRST_STARTS = """
import os, time
if os.environ.get("_CORRFIX_WORKER_ENDPOINT") is None:
    import corrfix.proxy._workers as workers  # the supervisor: a start-up limit a test can wait out
    workers.START_TIMEOUT = 5.0  # a worker that does not hang starts in about a second
else:
    for n in range(2):  # the first two workers to start hang before they listen
        try:
            os.close(os.open(os.path.join({markers!r}, f"hung-{{n}}"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        time.sleep(3600)
"""


def test_workers_that_hang_in_start_up_are_killed_and_restarted(tansu, tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HANG_FIRST_STARTS.format(markers=str(tmp_path)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    with two_workers(tansu.bootstrap, tmp_path / "w.log") as (proxy, _, _, _):
        events = [r["event"] for r in proxy.records()]
    assert sorted(p.name for p in tmp_path.glob("hung-*")) == ["hung-0", "hung-1"]
    # The two that hung, at least (on a very busy machine a restarted one could be slow too).
    assert events.count("worker did not start in time, killing it") >= 2
    assert events.count("worker exited, restarting") >= 2


def test_a_metrics_port_in_use_stops_the_workers_before_they_start():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        busy = taken.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "corrfix",
                *proxy_args(free_port(), "h:1", "--workers", "2"),
                "--metrics",
                f"127.0.0.1:{busy}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert "cannot start" in result.stderr and "workers started" not in result.stderr


def test_a_client_that_sends_no_request_is_closed_in_time():
    """Every client of the admin listener has a thread: one that connected and sent nothing
    (a half-open connection, a port scan) held it and its socket for as long as the proxy ran."""

    def live() -> Verdict:
        return Verdict(True, {"live": True})

    server = AdminServer(Address("127.0.0.1", 0), AdminApp(live, live), request_timeout=0.2)
    try:
        with socket.create_connection((server.address.host, server.address.port)) as idle:
            idle.settimeout(10)  # a hang guard: the server closes it after 0.2 s
            assert idle.recv(1) == b""
        assert probe(f"http://{server.address}/livez") == (200, {"live": True})
    finally:
        server.close()
