"""``corrfix proxy --workers N``: N proxy processes sharing the listen ports (SO_REUSEPORT).

The kernel spreads new connections over the workers, and a connection lives in one of
them; nothing else about the proxy changes. This supervisor starts the workers, passes
SIGTERM (drain) and SIGINT on to them, restarts a worker that dies on its own, and serves
one ``/metrics`` that sums every worker's samples (counters, gauges and histogram buckets
all add up across processes).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from types import FrameType

import structlog
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from corrfix._netutil import free_port
from corrfix.core import Address

log = structlog.get_logger("corrfix.workers")
MAX_RESTARTS = 10
SCRAPE_TIMEOUT = 2.0


class SummedWorkerMetrics(Collector):
    """Scrapes each worker's own endpoint and sums samples with the same name and labels."""

    def __init__(self, endpoints: Sequence[Address]) -> None:
        self.endpoints = list(endpoints)

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        sums: dict[tuple[str, str, tuple[tuple[str, str], ...]], float] = {}
        for endpoint in self.endpoints:
            try:
                url = f"http://{endpoint}/metrics"
                with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT) as response:
                    text = response.read().decode()
            except OSError:
                continue  # a worker restarting: its counters return with it
            for family in text_string_to_metric_families(text):
                families.setdefault(family.name, family)
                for sample in family.samples:
                    key = (family.name, sample.name, tuple(sorted(sample.labels.items())))
                    sums[key] = sums.get(key, 0.0) + sample.value
        for name, family in families.items():
            merged = Metric(name, family.documentation, family.type, family.unit)
            for (family_name, sample_name, labels), value in sums.items():
                if family_name == name:
                    merged.add_sample(sample_name, dict(labels), value)
            yield merged


def run_workers(argv: Sequence[str], workers: int, metrics: Address | None) -> int:
    """Run ``corrfix proxy ARGV`` as ``workers`` processes until they all stop."""
    endpoints = [Address("127.0.0.1", free_port()) for _ in range(workers)] if metrics else []

    def command(index: int) -> list[str]:
        extra = ["--workers", "1", "--reuse-port"]
        if endpoints:
            extra += ["--metrics", str(endpoints[index])]
        return [sys.executable, "-m", "corrfix", "proxy", *argv, *extra]

    processes = [subprocess.Popen(command(i)) for i in range(workers)]
    log.info("workers started", workers=workers, pids=[p.pid for p in processes])
    if metrics is not None:
        registry = CollectorRegistry()
        registry.register(SummedWorkerMetrics(endpoints))
        start_http_server(metrics.port, addr=metrics.host, registry=registry)
    stopping = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for process in processes:
            if process.poll() is None:
                process.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    restarts = 0
    while True:
        alive = [p for p in processes if p.poll() is None]
        if not alive and stopping:
            break
        for index, process in enumerate(processes):
            rc = process.poll()
            if rc is None or stopping:
                continue
            if restarts >= MAX_RESTARTS:
                log.error("worker keeps dying, stopping", worker=index, returncode=rc)
                forward(signal.SIGTERM, None)
                break
            restarts += 1
            log.warning("worker exited, restarting", worker=index, returncode=rc)
            processes[index] = subprocess.Popen(command(index))
        time.sleep(0.2)
    codes = [p.returncode for p in processes]
    log.info("workers stopped", returncodes=codes)
    return max((abs(code) for code in codes if code), default=0)
