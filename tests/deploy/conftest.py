"""The deploy tests' fixtures: promtool, and a live scrape of a real corrfix with traffic."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from corrfix._netutil import free_ports
from corrfix.lab import CorrfixProcess, TansuBroker, workload
from tests.support.health import wait_for_status
from tests.support.tools import require_tool

DEPLOY = Path(__file__).parents[2] / "deploy"
MESSAGES = 300


@pytest.fixture(scope="session")
def promtool() -> str:
    return require_tool("promtool", "CORRFIX_REQUIRE_PROMTOOL", "Debian: apt-get install prometheus")


@pytest.fixture(scope="session")
def live_scrape(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``/metrics`` of a corrfix that relayed produce and consume to Tansu, with a capture."""
    work = tmp_path_factory.mktemp("scrape")
    port, metrics_port = free_ports(2)
    with TansuBroker(advertised_port=port) as broker:
        args = [
            "proxy",
            "--listen",
            f"127.0.0.1:{port}",
            "--upstream",
            broker.bootstrap,
            "--metrics",
            f"127.0.0.1:{metrics_port}",
            "--capture-dir",
            str(work / "capture"),
        ]
        with CorrfixProcess(args, port, work / "proxy.log"):
            bootstrap = f"127.0.0.1:{port}"
            wait_for_status(f"http://127.0.0.1:{metrics_port}/readyz", 200)
            workload.create_topic(bootstrap, "scraped")
            assert workload.produce_kafka_python(bootstrap, "scraped", MESSAGES, acks=1).ok
            assert len(workload.consume_all(bootstrap, "scraped", MESSAGES)) == MESSAGES
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
                text = response.read().decode()
    (work / "metrics.txt").write_text(text)
    yield text
