"""Shared fixtures: Tansu brokers that are always stopped, whatever the test did.

The fixtures are synchronous (Tansu starts in about 20 ms), so they work unchanged for
plain tests and for trio tests under pytest-trio's ``trio_mode``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import pytest
import structlog
from hypothesis import settings

from corrfix.core import LOOPBACK
from corrfix.lab import TansuBroker

BROKER_FIXTURES = frozenset({"tansu", "tansu_factory"})

# No per-example time limit: on a shared 2-core machine a single example can be starved of
# the CPU for longer than hypothesis's default 200 ms, which says nothing about the code.
settings.register_profile("corrfix", deadline=None)
settings.load_profile("corrfix")


class TansuFactory(Protocol):
    """Signature of the ``tansu_factory`` fixture."""

    def __call__(
        self,
        advertised_port: int | None = None,
        *,
        advertised_host: str = LOOPBACK,
        port: int | None = None,
    ) -> TansuBroker: ...


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses a broker fixture, so ``-m "not broker"`` skips them all."""
    for item in items:
        if BROKER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.broker)


@pytest.fixture(autouse=True)
def structlog_configuration(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tests that run a command in-process configure structlog for the whole process (a
    level filter, an output that pytest closes after the test). Loggers must not cache
    that configuration on first use, or ``capture_logs`` in later tests sees nothing; and
    the next test gets back the configuration it expects."""
    saved = structlog.get_config()
    configure = structlog.configure

    def configure_uncached(**settings: object) -> None:
        configure(**{**settings, "cache_logger_on_first_use": False})

    monkeypatch.setattr(structlog, "configure", configure_uncached)
    yield
    structlog.reset_defaults()
    configure(**saved)


@pytest.fixture
def tansu_factory(request: pytest.FixtureRequest) -> Iterator[TansuFactory]:
    """Start Tansu brokers on demand; all of them are stopped when the test ends.

    ``tansu_factory(advertised_port=proxy_port)`` makes Tansu tell clients (Metadata,
    FindCoordinator) to connect to the proxy instead of to itself; with no argument it
    advertises its own address. Connect directly via ``broker.bootstrap``.
    Whatever a broker printed (errors, panics) is attached to the test report.
    """
    brokers: list[TansuBroker] = []

    def start(
        advertised_port: int | None = None,
        *,
        advertised_host: str = LOOPBACK,
        port: int | None = None,
    ) -> TansuBroker:
        broker = TansuBroker(port=port, advertised_host=advertised_host, advertised_port=advertised_port)
        brokers.append(broker)
        return broker.start()

    try:
        yield start
    finally:
        for broker in reversed(brokers):
            died = broker.pid is not None and not broker.running
            broker.stop()
            output = broker.output()
            if died or output:
                note = f"exited on its own with code {broker.returncode}\n" if died else ""
                request.node.add_report_section("teardown", f"tansu {broker!r}", note + output)


@pytest.fixture
def tansu(tansu_factory: TansuFactory) -> TansuBroker:
    """A running Tansu that advertises its own address (for clients talking to it directly)."""
    return tansu_factory()
