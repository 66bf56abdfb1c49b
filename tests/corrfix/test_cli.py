"""The command line as an operator runs it: a child process, JSON logs, SIGTERM."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request

import pytest

from corrfix._cli import build_parser
from corrfix._netutil import free_ports
from corrfix.lab import CorrfixProcess, workload
from corrfix.lab._demo import audit_capture


def test_proxy_help_documents_every_repair_option():
    text = build_parser().parse_args(["proxy", "--listen", ":1", "--upstream", "h:2"])
    assert text.listen.port == 1 and text.upstream.addresses[0].host == "h"
    help_text = subprocess.run(
        [sys.executable, "-m", "corrfix", "proxy", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for option in (
        "--probe-after",
        "--probe-min",
        "--max-requeues",
        "--request-deadline",
        "--produce-policy",
    ):
        assert option in help_text


def test_audit_is_a_command_that_needs_pyspark_only_when_it_runs():
    script = (
        "import sys; from corrfix._cli import build_parser; "
        "args = build_parser().parse_args(['audit', 'DIR', '-o', 'OUT', '--fail-on', 'error']); "
        "print(args.fail_on, 'pyspark' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["error", "False"]
    help_text = subprocess.run(
        [sys.executable, "-m", "corrfix", "audit", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--fail-on" in help_text and "report.html" in help_text


def test_without_pyspark_the_demo_says_how_to_audit_its_capture(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "pyspark", None)  # import pyspark now raises ImportError
    audit_capture(tmp_path / "capture", tmp_path / "audit")
    out = capsys.readouterr().out
    assert "pip install 'corrfix[audit]'" in out
    assert f"corrfix audit {tmp_path / 'capture'} -o {tmp_path / 'audit'}" in out


def test_bad_address_is_a_usage_error():
    result = subprocess.run(
        [sys.executable, "-m", "corrfix", "proxy", "--listen", "nonsense", "--upstream", "h:1"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "HOST:PORT" in result.stderr


@pytest.mark.broker
def test_a_listen_port_in_use_is_one_line_and_a_failing_exit():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "corrfix", "proxy", "--listen", f"127.0.0.1:{port}", "--upstream", "h:1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    output = (result.stdout + result.stderr).strip().splitlines()
    assert len(output) == 1, output
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in output[0]


def test_proxy_process_relays_serves_metrics_and_stops_cleanly_on_sigterm(tansu_factory, tmp_path):
    port, metrics_port = free_ports(2)
    broker = tansu_factory(advertised_port=port)
    args = ["proxy", "--listen", f"127.0.0.1:{port}", "--upstream", broker.bootstrap]
    proxy = CorrfixProcess([*args, "--metrics", f"127.0.0.1:{metrics_port}"], port, tmp_path / "p.log")
    with proxy:
        versions = workload.api_versions(f"127.0.0.1:{port}")
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
            scraped = response.read().decode()
    assert proxy.stop() == 0
    assert versions[18][1] >= 3
    assert 'corrfix_requests_total{api="ApiVersions"} 1.0' in scraped
    events = [record["event"] for record in proxy.records()]
    assert events[0] == "proxy listening" and events[-1] == "proxy stopped"
    assert "connection closed" in events


@pytest.mark.broker
def test_demo_runs_on_embedded_defaults_scaled_down(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "corrfix",
            "demo",
            "--acks0-messages",
            "2000",
            "--sync-messages",
            "30",
            "--request-timeout-ms",
            "1500",
            "--work-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "through corrfix" in result.stdout and "faults, corrfix" in result.stdout
    # It ends with the audit of corrfix's capture of both runs through it.
    report = tmp_path / "audit" / "report.html"
    assert f"Report: {report}" in result.stdout and report.exists()
    assert "skip_requeued=" in result.stdout


@pytest.mark.broker
def test_workers_share_the_port_and_sum_their_metrics(tansu, tmp_path):
    port, metrics_port = free_ports(2)
    args = ["proxy", "--listen", f"127.0.0.1:{port}", "--upstream", tansu.bootstrap, "--workers", "2"]
    proxy = CorrfixProcess([*args, "--metrics", f"127.0.0.1:{metrics_port}"], port, tmp_path / "w.log")
    bootstrap = f"127.0.0.1:{port}"
    with proxy:
        workload.create_topic(bootstrap, "workers")
        produced = workload.produce_kafka_python(bootstrap, "workers", 300, acks=1)
        values = workload.consume_all(bootstrap, "workers", 300)
        # Several fresh connections, so that the kernel has had the chance to use both workers.
        for _ in range(6):
            workload.api_versions(bootstrap)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
            scraped = response.read().decode()
    assert proxy.stop() == 0
    assert produced.ok and sorted(values) == workload.expected_values(300)
    records = proxy.records()
    assert sum(r["event"] == "proxy listening" for r in records) == 2
    assert next(r for r in records if r["event"] == "workers started")["workers"] == 2
    opened = [line for line in scraped.splitlines() if line.startswith("corrfix_connections_opened_total")]
    assert opened and float(opened[0].split()[-1]) >= 8
    assert 'corrfix_requests_total{api="ApiVersions"}' in scraped
