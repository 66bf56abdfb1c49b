"""Prometheus metrics for the proxy, served over HTTP by prometheus-client.

The connection core's events say what happened (``Forwarded``, ``Answered``, ``Repaired``);
the shell counts them here, with connections and bytes, so the core stays free of
prometheus. Label children are cached per api key, keeping the per-frame cost to a
dictionary lookup and an increment.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from corrfix.core import RepairKind
from protocol import api_name

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ProxyMetrics:
    """Every corrfix metric, in a registry of its own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self._requests = Counter("corrfix_requests", "Client requests relayed, by api", ["api"], registry=r)
        self._answers = Counter(
            "corrfix_answers", "Answers delivered to clients, by api", ["api"], registry=r
        )
        self._latency = Histogram(
            "corrfix_request_latency_seconds",
            "From the client's request to its answer, re-sends included, by api",
            ["api"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.repairs = Counter(
            "corrfix_repairs", "Repair events, by kind (see docs/repair.md)", ["kind"], registry=r
        )
        for kind in RepairKind:  # every kind from 0, so that rate() and alerts see the first one
            self.repairs.labels(kind.value)
        self.connections_opened = Counter(
            "corrfix_connections_opened", "Client connections accepted", registry=r
        )
        self.connections_active = Gauge("corrfix_connections_active", "Client connections open", registry=r)
        self.bytes = Counter(
            "corrfix_bytes", "Bytes relayed, by side and direction", ["side", "direction"], registry=r
        )
        # The four byte counters a relay bumps per receive and per send, looked up once.
        self.client_request_bytes = self.bytes.labels("client", "request")
        self.upstream_request_bytes = self.bytes.labels("upstream", "request")
        self.upstream_response_bytes = self.bytes.labels("upstream", "response")
        self.client_response_bytes = self.bytes.labels("client", "response")
        self.outstanding = Gauge("corrfix_outstanding_requests", "Requests awaiting an answer", registry=r)
        self.held_bytes = Gauge("corrfix_held_response_bytes", "Answers held for client order", registry=r)
        self._request_children: dict[int, Counter] = {}
        self._answer_children: dict[int, tuple[Counter, Histogram]] = {}
        self._repair_children: dict[str, Counter] = {}

    def request(self, api_key: int, count: int = 1) -> None:
        child = self._request_children.get(api_key)
        if child is None:
            child = self._request_children[api_key] = self._requests.labels(api_name(api_key))
        child.inc(count)

    def repair(self, kind: str) -> None:
        child = self._repair_children.get(kind)
        if child is None:
            child = self._repair_children[kind] = self.repairs.labels(kind)
        child.inc()

    def answer(self, api_key: int, seconds: float) -> None:
        children = self._answer_children.get(api_key)
        if children is None:
            label = api_name(api_key)
            children = self._answer_children[api_key] = (
                self._answers.labels(label),
                self._latency.labels(label),
            )
        children[0].inc()
        children[1].observe(seconds)

    def track_live(self, outstanding: Callable[[], float], held_bytes: Callable[[], float]) -> None:
        """Compute the gauges of live connections at scrape time, not per frame."""
        self.outstanding.set_function(outstanding)
        self.held_bytes.set_function(held_bytes)
