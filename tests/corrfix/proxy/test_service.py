"""The proxy as a service, in process: /livez and /readyz while Tansu is up, stopped,
restarted, and while the proxy drains. trio's MockClock runs at real speed (the broker is
real) and ``jump`` carries the readiness past its stale limit; each check's result arrives
on a channel, so the test waits for events, not for time."""

from __future__ import annotations

import math
import signal

import pytest
import trio
import trio.testing

from corrfix._cli import run_until_signalled
from corrfix.core import Address
from corrfix.proxy import Proxy, ProxyConfig, _service
from corrfix.proxy._engine import current_engine
from corrfix.proxy._health import Liveness, Readiness
from corrfix.proxy._readiness import CheckFailed, check_upstream
from corrfix.proxy._service import ProxyService
from corrfix.proxy._systemd import READY, STOPPING
from tests.support.polling import wait_until

INTERVAL = 0.1
STALE = 30.0


class ReportedChecks:
    """Real checks of the upstream whose results are also sent to the test."""

    def __init__(self) -> None:
        self.send, self.results = trio.open_memory_channel[tuple[str, str]](math.inf)

    async def __call__(self, upstream: Address, tls: object, timeout: float) -> int:
        try:
            apis = await check_upstream(upstream, None, timeout)
        except CheckFailed as exc:
            self.send.send_nowait(("failed", str(exc)))
            raise
        self.send.send_nowait(("ok", str(apis)))
        return apis

    async def next(self, outcome: str) -> str:
        """The next result with ``outcome``; others before it are skipped."""
        with trio.fail_after(20):
            async for got, detail in self.results:
                if got == outcome:
                    return detail
        raise AssertionError("the checks stopped")


def make_service(upstream: Address, checks: ReportedChecks) -> ProxyService:
    proxy = Proxy(ProxyConfig(Address("127.0.0.1", 0), upstream))
    readiness = Readiness([upstream], STALE)
    return ProxyService(
        proxy, Liveness(), readiness, ready_interval=INTERVAL, check=checks, clock=trio.current_time
    )


async def test_readiness_follows_tansu_stopped_and_restarted(tansu_factory, mock_clock):
    mock_clock.rate = 1.0
    broker = tansu_factory()
    upstream = Address("127.0.0.1", broker.port)
    checks = ReportedChecks()
    service = make_service(upstream, checks)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(service.serve)
        with trio.fail_after(20):
            await service.listening.wait()
        await checks.next("ok")
        assert service.live().ok and service.ready().ok

        await trio.to_thread.run_sync(broker.stop)
        refused = await checks.next("failed")
        assert "Connection refused" in refused
        assert service.ready().ok  # it answered less than STALE seconds ago
        mock_clock.jump(STALE + 1)
        verdict = service.ready()
        assert verdict.status == 503
        (reason,) = verdict.detail["reasons"]
        assert reason.startswith(f"{upstream}: no ApiVersions answer for ")
        assert "Connection refused" in reason
        # The jump looks, to /livez, like an event loop that did not run for STALE seconds...
        assert "has not run its heartbeat" in service.live().detail["reason"]
        await trio.testing.wait_all_tasks_blocked()
        # ...until its heartbeat runs; an unreachable broker is no reason to restart corrfix.
        assert service.live().ok

        restarted = await trio.to_thread.run_sync(lambda: tansu_factory(port=upstream.port))
        assert restarted.port == upstream.port
        await checks.next("ok")
        assert service.ready().ok
        nursery.cancel_scope.cancel()


async def test_draining_is_not_ready_before_the_proxy_stops_accepting(tansu, mock_clock):
    mock_clock.rate = 1.0
    upstream = Address("127.0.0.1", tansu.port)
    checks = ReportedChecks()
    service = make_service(upstream, checks)
    seen_by_drain = []
    proxy_drain = service.proxy.drain

    def drain(timeout: float) -> None:
        seen_by_drain.append((service.ready().status, service.live().status))
        proxy_drain(timeout)

    service.proxy.drain = drain  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(service.serve)
        with trio.fail_after(20):
            await service.listening.wait()
        await checks.next("ok")
        assert service.ready().ok
        service.drain(5.0)
        assert seen_by_drain == [(503, 200)]  # not ready first, still live
        assert service.ready().detail["reasons"] == ["draining: the proxy takes no new connections"]
    # No connection to finish: serve() returned, and liveness says so.
    assert service.live().detail["reason"] == "the proxy has stopped serving"


async def test_without_checks_readyz_says_so():
    service = ProxyService(Proxy(ProxyConfig(Address("127.0.0.1", 0), Address("127.0.0.1", 1))), Liveness())
    assert service.ready().detail == {"ready": False, "reasons": ["upstream checks are off"]}


class EngineInAPass:
    """The one thing ``/livez`` asks of the relay engine: how long its pass in progress has run."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def pass_seconds(self) -> float:
        return self.seconds


async def test_livez_asks_the_engine_of_the_run_it_serves():
    """``serve()`` takes the run's relay engine, and ``/livez`` fails while a pass of it has run
    past the stall limit, though the event loop beats."""
    proxy = Proxy(ProxyConfig(Address("127.0.0.1", 0), Address("127.0.0.1", 1)))
    service = ProxyService(proxy, Liveness(stall_limit=10), clock=trio.current_time)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(service.serve)
        with trio.fail_after(20):
            await service.listening.wait()
        assert service.engine is current_engine()
        engine = EngineInAPass()
        service.engine = engine  # type: ignore[assignment]
        assert service.live().ok
        engine.seconds = 10.5
        verdict = service.live()
        assert not verdict.ok
        assert verdict.detail["reason"] == (
            "the relay engine has been in one pass for 10.5 s (limit 10 s):"
            " its plaintext connections are not served"
        )
        engine.seconds = 0.0
        assert service.live().ok
        nursery.cancel_scope.cancel()


async def test_a_sigterm_while_starting_stops_the_proxy_before_it_listens(monkeypatch):
    """A SIGTERM before the listeners are up (a pod deleted as it starts): the drain found no
    connections to give a deadline and the proxy died of it with a traceback. Now it stops
    without listening, and tells systemd STOPPING=1 alone, never READY=1 after it."""
    told: list[str] = []
    monkeypatch.setattr(_service, "notify", told.append)
    proxy = Proxy(ProxyConfig(Address("127.0.0.1", 0), Address("127.0.0.1", 1)))
    service = ProxyService(proxy, Liveness())
    drained: list[bool] = []

    def drain() -> None:
        drained.append(True)
        service.drain(5.0)

    async def start_once_signalled() -> None:
        signal.raise_signal(signal.SIGTERM)  # to the receiver run_until_signalled holds
        await wait_until(lambda: drained)
        await service.serve()

    with trio.fail_after(10):
        await run_until_signalled(start_once_signalled, drain=drain)
    assert told == [STOPPING]
    assert not service.listening.is_set()
    assert service.live().detail["reason"] == "the proxy has stopped serving"


async def test_sighup_tells_systemd_of_a_reload_only_while_the_proxy_serves(monkeypatch):
    """SIGHUP (a log rotation) re-opens the files whenever it comes, but READY=1 before the
    listeners are up told systemd the proxy was started too soon, and one while draining
    came after STOPPING=1."""
    told: list[str] = []
    monkeypatch.setattr(_service, "notify", told.append)
    reopened: list[bool] = []
    proxy = Proxy(ProxyConfig(Address("127.0.0.1", 0), Address("127.0.0.1", 1)))
    service = ProxyService(proxy, Liveness(), reopen=lambda: reopened.append(True))
    service.reload()  # while starting
    async with trio.open_nursery() as nursery:
        nursery.start_soon(service.serve)
        with trio.fail_after(20):
            await service.listening.wait()
        service.reload()
        service.drain(5.0)
        service.reload()  # while draining
    assert len(reopened) == 3
    assert [message.split("\n")[0] for message in told] == [READY, "RELOADING=1", READY, STOPPING]


@pytest.fixture
def mock_clock():
    return trio.testing.MockClock()
