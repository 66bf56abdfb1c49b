"""What the relay engine adds to ``/metrics``, read at scrape time, never on its hot path.

One thread relays every plaintext connection of a process, so that thread's CPU is the
proxy's capacity: busy near one second per second, requests queue behind it, and more
``--workers`` (one per core) are the remedy. Its CPU over the requests relayed is the
figure bench/ quotes, CPU µs per request, for the running proxy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from corrfix.proxy._engine import RelayEngine

_Family = tuple[type[GaugeMetricFamily | CounterMetricFamily], str, str, Callable[[RelayEngine], float]]
"""A metric family, its name and help, and how its one value is read off the engine."""

_FAMILIES: tuple[_Family, ...] = (
    (
        GaugeMetricFamily,
        "corrfix_engine_connections",
        "Plaintext connections relayed by the relay engine",
        lambda engine: engine.connections,
    ),
    (
        GaugeMetricFamily,
        "corrfix_engine_threads",
        "1 while the relay engine's thread runs (it starts with the first connection)",
        lambda engine: 1 if engine.running_thread else 0,
    ),
    (
        CounterMetricFamily,
        "corrfix_engine_passes",
        "Passes of the relay engine over its ready sockets",
        lambda engine: engine.passes,
    ),
    (
        CounterMetricFamily,
        "corrfix_engine_cpu_seconds",
        "CPU time of the relay engine's thread; near 1 s per s it is saturated (add --workers)",
        lambda engine: engine.cpu_seconds(),
    ),
)


class EngineCollector(Collector):
    """``corrfix_engine_connections``, ``corrfix_engine_threads``,
    ``corrfix_engine_passes_total`` and ``corrfix_engine_cpu_seconds_total``."""

    def __init__(self, engine: Callable[[], RelayEngine | None]) -> None:
        self.engine = engine  # None until the proxy runs: every family is still exported, at 0

    def collect(self) -> Iterator[Metric]:
        engine = self.engine()
        for family, name, documentation, read in _FAMILIES:
            metric = family(name, documentation)
            metric.add_metric([], read(engine) if engine is not None else 0)
            yield metric
