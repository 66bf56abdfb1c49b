"""What the health checks, the limits and the capture add to ``/metrics``, read at scrape time.

The alert rules in ``deploy/`` use them: an upstream that stopped answering, the proxy not
ready, connections near ``--max-connections``, capture rows lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from corrfix.proxy._health import Readiness


class HealthCollector(Collector):
    """``corrfix_upstream_up``, ``corrfix_ready``, ``corrfix_connections_max`` and, with a
    capture, ``corrfix_capture_rows_written_total``, ``corrfix_capture_rows_lost_total`` and
    ``corrfix_capture_bytes_removed_total``."""

    def __init__(
        self,
        readiness: Readiness | None,
        max_connections: int,
        capture: Callable[[], tuple[int, int, int]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.readiness = readiness
        self.max_connections = max_connections
        self.capture = capture
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        limit = GaugeMetricFamily("corrfix_connections_max", "Client connections allowed (--max-connections)")
        limit.add_metric([], self.max_connections)
        yield limit
        if self.readiness is not None:
            now = self.clock()
            up = GaugeMetricFamily(
                "corrfix_upstream_up",
                "1 when the upstream answered ApiVersions within --ready-stale seconds",
                labels=["upstream"],
            )
            for check in self.readiness.checks():
                up.add_metric([str(check.upstream)], 1.0 if self.readiness.up(check, now) else 0.0)
            yield up
            ready = GaugeMetricFamily("corrfix_ready", "1 when /readyz answers 200")
            ready.add_metric([], 1.0 if self.readiness.verdict(now).ok else 0.0)
            yield ready
        if self.capture is not None:
            written, lost, removed = self.capture()
            rows = CounterMetricFamily("corrfix_capture_rows_written", "Capture rows written to files")
            rows.add_metric([], written)
            yield rows
            dropped = CounterMetricFamily(
                "corrfix_capture_rows_lost", "Capture rows dropped because the writer fell behind or failed"
            )
            dropped.add_metric([], lost)
            yield dropped
            ring = CounterMetricFamily(
                "corrfix_capture_bytes_removed", "Capture file bytes removed under --capture-max-bytes"
            )
            ring.add_metric([], removed)
            yield ring
