"""The proxy as a service: its heartbeat, upstream checks, drain and reload, told to systemd.

:class:`ProxyService` runs :meth:`Proxy.serve` with what operating it needs around it:

* a heartbeat task, so ``/livez`` notices an event loop that stopped running, and the
  relay engine's pass in progress, so it notices an engine stuck in one;
* the upstream ApiVersions checks behind ``/readyz``;
* ``READY=1`` to the service manager once the listeners are up;
* :meth:`drain` (SIGTERM): ``/readyz`` turns 503 and ``STOPPING=1`` is sent *before* the
  proxy stops accepting, so that load balancers stop sending new connections first; one
  that comes while the proxy starts stops it before it listens, and READY=1 is never sent;
* :meth:`reload` (SIGHUP): re-open the log file, start new capture files and load the
  TLS files anew.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Protocol

import structlog
import trio

from corrfix.core import Address
from corrfix.proxy._admin import AdminApp, AdminServer
from corrfix.proxy._engine import RelayEngine, current_engine
from corrfix.proxy._engine_metrics import EngineCollector
from corrfix.proxy._health import Liveness, Readiness, Verdict
from corrfix.proxy._health_metrics import HealthCollector
from corrfix.proxy._metrics import ProxyMetrics
from corrfix.proxy._readiness import (
    DEFAULT_READY_INTERVAL,
    DEFAULT_READY_STALE,
    CheckFunction,
    check_upstream,
    run_readiness_checks,
)
from corrfix.proxy._server import Proxy
from corrfix.proxy._systemd import READY, STOPPING, endpoint, notify, reloading

log = structlog.get_logger("corrfix.service")

HEARTBEAT_INTERVAL = 1.0


class ProxyService:
    def __init__(
        self,
        proxy: Proxy,
        liveness: Liveness,
        readiness: Readiness | None = None,
        *,
        ready_interval: float = DEFAULT_READY_INTERVAL,
        reopen: Callable[[], None] | None = None,
        check: CheckFunction = check_upstream,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proxy = proxy
        self.liveness = liveness
        self.readiness = readiness
        self.ready_interval = ready_interval
        self.reopen = reopen
        self.check = check
        self.clock = clock
        self.listening = trio.Event()
        """Set once the listeners are up (and READY=1 was sent)."""
        self.endpoint: Address | None = None
        """Where ``/livez`` and ``/readyz`` are served, said along with every READY=1."""
        self.engine: RelayEngine | None = None
        """The relay engine of the run being served (one per process), once it started."""
        self.draining = False
        """Set by :meth:`drain`: STOPPING=1 was sent, so READY=1 never is again."""

    @classmethod
    def build(
        cls,
        proxy: Proxy,
        *,
        ready_interval: float = DEFAULT_READY_INTERVAL,
        ready_stale: float = DEFAULT_READY_STALE,
        checked: bool = True,
        reopen: Callable[[], None] | None = None,
    ) -> ProxyService:
        """The service of ``proxy``; ``checked``: check the upstream for ``/readyz``."""
        readiness = Readiness(proxy.config.bootstrap, ready_stale) if checked else None
        return cls(proxy, Liveness(), readiness, ready_interval=ready_interval, reopen=reopen)

    def live(self) -> Verdict:
        engine = self.engine
        return self.liveness.verdict(self.clock(), engine.pass_seconds() if engine is not None else 0.0)

    def ready(self) -> Verdict:
        if self.readiness is None:
            return Verdict(False, {"ready": False, "reasons": ["upstream checks are off"]})
        return self.readiness.verdict(self.clock())

    async def serve(self) -> None:
        """Serve until the proxy stops (cancelled, or drained)."""
        self.engine = current_engine()
        async with trio.open_nursery() as nursery:

            async def serve_proxy(*, task_status: trio.TaskStatus[object] = trio.TASK_STATUS_IGNORED) -> None:
                try:
                    await self.proxy.serve(task_status=task_status)
                finally:
                    self.liveness.stopped()
                nursery.cancel_scope.cancel()

            nursery.start_soon(self._heartbeat)
            if self.readiness is not None:
                config = self.proxy.config
                checks = functools.partial(
                    run_readiness_checks,
                    self.readiness,
                    interval=self.ready_interval,
                    timeout=config.connect_timeout,
                    tls=config.tls,
                    check=self.check,
                    clock=self.clock,
                )
                nursery.start_soon(checks)
            await nursery.start(serve_proxy)
            if self.draining:  # a SIGTERM while starting: the proxy stops without serving
                return
            self.liveness.listening()
            notify(self._ready_message())
            self.listening.set()

    async def _heartbeat(self) -> None:
        while True:
            self.liveness.beat(self.clock())
            await trio.sleep(HEARTBEAT_INTERVAL)

    def drain(self, timeout: float) -> None:
        """Not ready at once, then stop accepting and let connections finish within ``timeout``."""
        self.draining = True
        if self.readiness is not None:
            self.readiness.start_draining()
        notify(STOPPING)
        self.proxy.drain(timeout)

    def reload(self) -> None:
        """Re-open the log file, start new capture files and load the TLS files anew (SIGHUP).

        systemd hears of it only while the proxy serves: READY=1 before the listeners are up
        would say so too soon, and one after STOPPING=1 would take the stop back."""
        serving = self.listening.is_set() and not self.draining
        if serving:
            notify(reloading())
        if self.reopen is not None:
            self.reopen()
        log.info("reopened log and capture files")
        self.proxy.reload_tls()
        if serving:
            notify(self._ready_message())

    def _ready_message(self) -> str:
        """READY=1, with the endpoint: a worker's supervisor learns its port from it (the
        worker asked for port 0), in the same datagram and again after each reload."""
        return READY if self.endpoint is None else f"{READY}\n{endpoint(self.endpoint)}"


class CaptureStats(Protocol):
    """What the admin listener reads of a capture writer: its rows written and lost, and the
    bytes it removed under ``--capture-max-bytes``."""

    @property
    def stats(self) -> _RowCounts: ...


class _RowCounts(Protocol):
    """Read-only, as the writer's frozen stats are."""

    @property
    def rows_written(self) -> int: ...

    @property
    def rows_lost(self) -> int: ...

    @property
    def bytes_removed(self) -> int: ...


def open_admin(
    service: ProxyService,
    metrics: ProxyMetrics | None,
    metrics_address: Address | None,
    admin_address: Address | None,
    capture: CaptureStats | None = None,
) -> list[AdminServer]:
    """Serve ``/metrics`` (with the health metrics) and the health endpoints where asked; the
    first of them (``/metrics`` when both are asked) is the service's endpoint."""
    servers = []
    if metrics is not None and metrics_address is not None:

        def rows() -> tuple[int, int, int]:
            assert capture is not None
            stats = capture.stats
            return stats.rows_written, stats.rows_lost, stats.bytes_removed

        collector = HealthCollector(
            service.readiness,
            service.proxy.config.max_connections,
            rows if capture is not None else None,
            service.clock,
        )
        metrics.registry.register(collector)
        metrics.registry.register(EngineCollector(lambda: service.engine))
        servers.append(AdminServer(metrics_address, AdminApp(service.live, service.ready, metrics.registry)))
    if admin_address is not None:
        servers.append(AdminServer(admin_address, AdminApp(service.live, service.ready)))
    if servers:
        service.endpoint = servers[0].address
    return servers
