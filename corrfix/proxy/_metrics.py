"""Prometheus metrics for the proxy, served over HTTP by prometheus-client.

The connection core's events say what happened (``Forwarded``, ``Answered``, ``Repaired``);
the shell counts them here, with connections and bytes, so the core stays free of
prometheus. Without capture, which needs those events anyway, the machine adds each request
and answer to a :class:`MetricTally` itself (it is a :class:`~corrfix.core.FlowCounter`):
cheaper than an event and a sink's loop over it. What is counted per request and per
receive (requests and answers by api, the latency histogram, bytes) goes into plain
integers of the counting thread's own :class:`MetricTally`, which the registry reads and
sums at scrape time: prometheus-client's
own counters take a lock per increment (0.6 µs) and its histogram walks its buckets in
Python (2 µs per answer), which doubled the relay's CPU per request with ``--metrics``
(bench/README.md). Each tally is written by one thread only, so no count is lost, and
only ever grows, so every counter stays monotonic. Rare events (repairs, connections)
keep prometheus-client's own metrics.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator
from threading import get_ident

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from corrfix.core import RepairKind
from protocol import api_name

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BYTES_LABELS = (
    ("client", "request"),
    ("upstream", "request"),
    ("upstream", "response"),
    ("client", "response"),
)


class MetricTally:
    """One thread's counts since the proxy started; only that thread writes them."""

    __slots__ = (
        "answers",
        "client_request_bytes",
        "client_response_bytes",
        "requests",
        "upstream_request_bytes",
        "upstream_response_bytes",
    )

    def __init__(self) -> None:
        self.client_request_bytes = 0
        self.upstream_request_bytes = 0
        self.upstream_response_bytes = 0
        self.client_response_bytes = 0
        self.requests: dict[int, int] = {}
        """Client requests relayed, by api key."""
        self.answers: dict[int, list[float]] = {}
        """By api key: the latencies' sum, then the answers per latency bucket (the last one
        past every bound), each bucket counted alone: the scrape makes them cumulative."""

    def answer(self, api_key: int, seconds: float) -> None:
        entry = self.answers.get(api_key)
        if entry is None:
            entry = self.answers[api_key] = [0.0] * (len(LATENCY_BUCKETS) + 2)
        entry[0] += seconds
        entry[1 + bisect_left(LATENCY_BUCKETS, seconds)] += 1  # the first bound >= seconds: le


class _TallyCollector(Collector):
    """``corrfix_requests``, ``corrfix_answers``, ``corrfix_request_latency_seconds`` and
    ``corrfix_bytes``, summed over every thread's tally at scrape time."""

    def __init__(self, tallies: Callable[[], list[MetricTally]]) -> None:
        self._tallies = tallies

    def collect(self) -> Iterator[Metric]:
        tallies = self._tallies()
        requests: dict[int, int] = {}
        answers: dict[int, list[float]] = {}
        sent = [0, 0, 0, 0]
        for tally in tallies:
            # Copies first: each is one step under the GIL while the tally's thread counts on.
            for api_key, count in list(tally.requests.items()):
                requests[api_key] = requests.get(api_key, 0) + count
            for api_key, entry in list(tally.answers.items()):
                total = answers.setdefault(api_key, [0.0] * len(entry))
                for i, value in enumerate(list(entry)):
                    total[i] += value
            for i, value in enumerate(
                (
                    tally.client_request_bytes,
                    tally.upstream_request_bytes,
                    tally.upstream_response_bytes,
                    tally.client_response_bytes,
                )
            ):
                sent[i] += value
        family = CounterMetricFamily("corrfix_requests", "Client requests relayed, by api", labels=["api"])
        for api_key, count in sorted(requests.items()):
            family.add_metric([api_name(api_key)], count)
        yield family
        counts = CounterMetricFamily(
            "corrfix_answers", "Answers delivered to clients, by api", labels=["api"]
        )
        latency = HistogramMetricFamily(
            "corrfix_request_latency_seconds",
            "From the client's request to its answer, re-sends included, by api",
            labels=["api"],
        )
        for api_key, entry in sorted(answers.items()):
            label = api_name(api_key)
            cumulative, buckets = 0.0, []
            for bound, answered in zip((*LATENCY_BUCKETS, float("inf")), entry[1:], strict=True):
                cumulative += answered
                buckets.append((floatToGoString(bound), cumulative))
            counts.add_metric([label], cumulative)
            latency.add_metric([label], buckets, sum_value=entry[0])
        yield counts
        yield latency
        moved = CounterMetricFamily(
            "corrfix_bytes", "Bytes relayed, by side and direction", labels=["side", "direction"]
        )
        for labels, value in zip(_BYTES_LABELS, sent, strict=True):
            moved.add_metric(list(labels), value)
        yield moved


class _TlsReloadCollector(Collector):
    def __init__(self, reloads: Callable[[], tuple[int, int, bool]]) -> None:
        self._reloads = reloads

    def collect(self) -> Iterator[Metric]:
        loaded, failed, failing = self._reloads()
        counts = CounterMetricFamily(
            "corrfix_tls_reloads", "TLS files loaded anew (rotated, or SIGHUP), by result", labels=["result"]
        )
        counts.add_metric(["loaded"], loaded)
        counts.add_metric(["failed"], failed)
        yield counts
        yield GaugeMetricFamily(
            "corrfix_tls_reload_failed",
            "1 while the TLS files on disk cannot be loaded: older ones are still in use",
            value=1 if failing else 0,
        )


class ProxyMetrics:
    """Every corrfix metric, in a registry of its own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self._tallies: dict[int, MetricTally] = {}  # by thread id: one C call and a lookup per count
        self._tallies_lock = threading.Lock()
        r.register(_TallyCollector(self._all_tallies))
        self.repairs = Counter(
            "corrfix_repairs", "Repair events, by kind (see docs/repair.md)", ["kind"], registry=r
        )
        for kind in RepairKind:  # every kind from 0, so that rate() and alerts see the first one
            self.repairs.labels(kind.value)
        self.connections_opened = Counter(
            "corrfix_connections_opened", "Client connections accepted", registry=r
        )
        self.connections_active = Gauge("corrfix_connections_active", "Client connections open", registry=r)
        self.outstanding = Gauge("corrfix_outstanding_requests", "Requests awaiting an answer", registry=r)
        self.outstanding_bytes = Gauge(
            "corrfix_outstanding_request_bytes", "Requests kept for re-sending until answered", registry=r
        )
        self.held_bytes = Gauge("corrfix_held_response_bytes", "Answers held for client order", registry=r)
        self._repair_children: dict[str, Counter] = {}
        self._tls_reloads: Callable[[], tuple[int, int, bool]] = lambda: (0, 0, False)
        r.register(_TlsReloadCollector(lambda: self._tls_reloads()))

    def tally(self) -> MetricTally:
        """The calling thread's tally (trio's, the relay engine's), made on its first count."""
        tally = self._tallies.get(get_ident())
        if tally is None:
            with self._tallies_lock:  # a copy of the tallies may be taken for a scrape
                tally = self._tallies[get_ident()] = MetricTally()
        return tally

    def _all_tallies(self) -> list[MetricTally]:
        with self._tallies_lock:
            return list(self._tallies.values())

    def repair(self, kind: str) -> None:
        child = self._repair_children.get(kind)
        if child is None:
            child = self._repair_children[kind] = self.repairs.labels(kind)
        child.inc()

    def track_tls(self, reloads: Callable[[], tuple[int, int, bool]]) -> None:
        """``corrfix_tls_reloads`` and ``corrfix_tls_reload_failed``, read at scrape time from
        ``reloads()``: the loads that worked, those that failed, and whether the files on disk
        cannot be loaded now (the previous ones are then still in use, until they expire).
        Without TLS both are served as zeros, so that alert rules find them everywhere."""
        self._tls_reloads = reloads

    def track_live(
        self,
        outstanding: Callable[[], float],
        outstanding_bytes: Callable[[], float],
        held_bytes: Callable[[], float],
    ) -> None:
        """Compute the gauges of live connections at scrape time, not per frame."""
        self.outstanding.set_function(outstanding)
        self.outstanding_bytes.set_function(outstanding_bytes)
        self.held_bytes.set_function(held_bytes)
