"""The per-request metrics are counted in plain integers per thread and summed at scrape time:
what a scrape shows must be what prometheus-client's own counters and histogram would show."""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram

from corrfix.proxy import ProxyMetrics
from corrfix.proxy._metrics import LATENCY_BUCKETS
from protocol import ApiKey, api_name

API_KEYS = [ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA]
ANSWERS = st.lists(
    st.tuples(
        st.integers(0, 2),  # the thread that counts it
        st.sampled_from(API_KEYS),
        st.one_of(st.sampled_from(LATENCY_BUCKETS), st.floats(0, 100, allow_nan=False)),  # bounds are le
    ),
    max_size=60,
)


def reference(answers: list[tuple[int, int, float]]) -> CollectorRegistry:
    """The same answers into prometheus-client's own metrics, as corrfix counted them before."""
    registry = CollectorRegistry()
    requests = Counter("corrfix_requests", "", ["api"], registry=registry)
    counted = Counter("corrfix_answers", "", ["api"], registry=registry)
    latency = Histogram(
        "corrfix_request_latency_seconds", "", ["api"], buckets=LATENCY_BUCKETS, registry=registry
    )
    for _, api_key, seconds in answers:
        requests.labels(api_name(api_key)).inc()
        counted.labels(api_name(api_key)).inc()
        latency.labels(api_name(api_key)).observe(seconds)
    return registry


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in registry.collect()
        for sample in family.samples
        if family.name in ("corrfix_requests", "corrfix_answers", "corrfix_request_latency_seconds")
        and not sample.name.endswith("_created")
    }


@settings(max_examples=60, deadline=None)
@given(ANSWERS)
def test_a_scrape_shows_what_prometheus_client_s_own_metrics_would(answers):
    """Counted by three threads, each into its own tally: the scrape sums them into the same
    samples as one prometheus-client counter and histogram fed every answer."""
    metrics = ProxyMetrics()
    for thread in range(3):
        mine = [(api_key, seconds) for counted_by, api_key, seconds in answers if counted_by == thread]

        def count(mine: list[tuple[int, float]] = mine) -> None:
            tally = metrics.tally()
            for api_key, seconds in mine:
                tally.requests[api_key] = tally.requests.get(api_key, 0) + 1
                tally.answer(api_key, seconds)

        worker = threading.Thread(target=count)
        worker.start()
        worker.join()
    got, expected = samples(metrics.registry), samples(reference(answers))
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key


def test_each_thread_counts_into_its_own_tally_and_bytes_add_up():
    metrics = ProxyMetrics()
    mine = metrics.tally()
    assert metrics.tally() is mine
    theirs: list[object] = []

    def count() -> None:
        tally = metrics.tally()
        theirs.append(tally)
        tally.client_request_bytes += 40

    worker = threading.Thread(target=count)
    worker.start()
    worker.join()
    assert theirs[0] is not mine
    mine.client_request_bytes += 2
    mine.client_response_bytes += 7
    value = metrics.registry.get_sample_value
    assert value("corrfix_bytes_total", {"side": "client", "direction": "request"}) == 42
    assert value("corrfix_bytes_total", {"side": "client", "direction": "response"}) == 7
    assert value("corrfix_bytes_total", {"side": "upstream", "direction": "request"}) == 0
