"""Repair warnings held to a rate per kind: a burst, then a steady rate, and the next line
written says how many were left out; every repair is counted whether its line is or not."""

from __future__ import annotations

import threading

import structlog
import trio
from structlog.testing import capture_logs

from corrfix.core import LOOPBACK, Address, Repaired, RepairKind
from corrfix.proxy import Proxy, ProxyConfig
from corrfix.proxy._sinks import ConnectionSinks, ProxyStats
from corrfix.proxy._throttle import HELD_REPORT_INTERVAL, LogThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_then_the_rate_and_the_next_line_says_how_many_were_left_out():
    clock = Clock()
    throttle = LogThrottle(rate=10, burst=20, clock=clock)
    admitted = [throttle.admit("skip_detected") for _ in range(1000)]
    assert admitted[:20] == [0] * 20 and admitted[20:] == [None] * 980
    clock.now += 0.05  # half a line's worth: still none
    assert throttle.admit("skip_detected") is None
    clock.now += 0.1  # a line and a half's
    assert throttle.admit("skip_detected") == 981  # every line left out since the last written
    assert throttle.admit("skip_detected") is None
    clock.now += 60.0  # a quiet minute refills the burst, no more
    assert [throttle.admit("skip_detected") for _ in range(21)] == [1] + [0] * 19 + [None]


def test_each_kind_has_its_own_allowance():
    throttle = LogThrottle(rate=10, burst=2, clock=Clock())
    assert [throttle.admit("requeue") for _ in range(3)] == [0, 0, None]
    assert [throttle.admit("give_up") for _ in range(3)] == [0, 0, None]


def test_threads_asking_at_once_get_exactly_the_burst():
    throttle = LogThrottle(rate=0.0, burst=50, clock=Clock())  # no refill: only the burst
    admitted: list[int | None] = []
    lock = threading.Lock()

    def ask() -> None:
        for _ in range(1000):
            answer = throttle.admit("requeue")
            with lock:
                admitted.append(answer)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(answer is not None for answer in admitted) == 50


def test_a_storm_of_repairs_is_counted_in_full_and_logged_in_part():
    clock = Clock()
    stats = ProxyStats(repair_warnings=LogThrottle(rate=10, burst=20, clock=clock))
    sinks = ConnectionSinks("c1", structlog.get_logger(), stats, Address(LOOPBACK, 9092), None, None)
    storm = [Repaired(RepairKind.SKIP_DETECTED, api_key=0, upstream_correlation_id=i) for i in range(500)]
    stale = [Repaired(RepairKind.STALE_DROP, api_key=0, upstream_correlation_id=i) for i in range(500)]
    with capture_logs() as logs:
        sinks.output([], [], [*storm, *stale])
        clock.now += 1.0
        sinks.output([], [], [Repaired(RepairKind.SKIP_DETECTED, api_key=0, upstream_correlation_id=500)])
    warned = [entry for entry in logs if entry["event"] == "repair.skip_detected"]
    assert len(warned) == 21 and all("suppressed" not in entry for entry in warned[:20])
    assert warned[20]["suppressed"] == 480 and warned[20]["upstream_correlation_id"] == 500
    assert sinks.repairs["skip_detected"] == stats.repairs["skip_detected"] == 501
    assert sinks.repairs["stale_drop"] == 500  # a debug line each: not held to the rate


def test_lines_left_out_are_taken_once():
    clock = Clock()
    throttle = LogThrottle(rate=10, burst=2, clock=clock)
    for _ in range(7):
        throttle.admit("requeue")
    throttle.admit("give_up")
    assert throttle.take_held() == {"requeue": 5}
    assert throttle.take_held() == {}
    clock.now += 1.0
    assert throttle.admit("requeue") == 0  # the next line has nothing more to say


async def test_the_proxy_says_what_a_storm_that_ended_left_out(autojump_clock):
    """No repair line follows the storm: the proxy's own line, every HELD_REPORT_INTERVAL,
    counts the lines left out (the clock is trio's MockClock, jumping when all tasks wait)."""
    proxy = Proxy(ProxyConfig(Address(LOOPBACK, 0), Address(LOOPBACK, 1)))
    clock = Clock()
    proxy.stats.repair_warnings = LogThrottle(rate=10, burst=20, clock=clock)
    for _ in range(500):
        proxy.stats.repair_warnings.admit("skip_detected")
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.serve)
            await trio.sleep(HELD_REPORT_INTERVAL - 1)
            assert not [e for e in logs if e["event"] == "repair warnings left out"]
            await trio.sleep(HELD_REPORT_INTERVAL)  # one report, then nothing more to say
            nursery.cancel_scope.cancel()
    left_out = [(e["kind"], e["suppressed"]) for e in logs if e["event"] == "repair warnings left out"]
    assert left_out == [("skip_detected", 480)]
