"""/livez and /readyz verdicts from recorded facts and a given time (sans-IO, no clock)."""

from __future__ import annotations

import json

from corrfix.core import Address
from corrfix.proxy._health import Liveness, Readiness

BROKER = Address("127.0.0.1", 9092)
OTHER = Address("broker-2", 9092)


def test_live_once_listening_while_the_loop_beats():
    liveness = Liveness(stall_limit=10)
    assert liveness.verdict(0).detail["reason"] == "the listeners are not up yet"
    liveness.beat(100)
    liveness.listening()
    assert liveness.verdict(105).ok and liveness.verdict(105).status == 200
    stalled = liveness.verdict(110.5)
    assert not stalled.ok and stalled.status == 503
    assert stalled.detail["reason"] == "the event loop has not run its heartbeat for 10.5 s (limit 10 s)"
    liveness.beat(111)
    assert liveness.verdict(111).ok
    liveness.stopped()
    assert liveness.verdict(111).detail == {"live": False, "reason": "the proxy has stopped serving"}


def test_not_live_while_the_relay_engine_is_stuck_in_one_pass():
    """The loop beats on while the engine's thread is stuck: plaintext connections are not
    served, so ``/livez`` fails, and says which of the two stopped."""
    liveness = Liveness(stall_limit=10)
    liveness.beat(100)
    liveness.listening()
    assert liveness.verdict(101, engine_pass=10).ok  # at the limit: still live
    stuck = liveness.verdict(101, engine_pass=12.25)
    assert not stuck.ok
    assert stuck.detail["reason"] == (
        "the relay engine has been in one pass for 12.2 s (limit 10 s):"
        " its plaintext connections are not served"
    )
    assert "heartbeat" in liveness.verdict(120, engine_pass=12.25).detail["reason"]  # the loop first


def test_not_ready_before_the_first_check():
    verdict = Readiness([BROKER], stale=15).verdict(0)
    assert not verdict.ok
    assert verdict.detail["reasons"] == ["127.0.0.1:9092: not checked yet"]


def test_ready_while_a_bootstrap_broker_answered_within_the_stale_limit():
    """Several bootstrap brokers are a client's ``bootstrap.servers``: one that answers is
    enough to bootstrap from, so one broker down does not make every proxy unready (and,
    behind a Service, the whole cluster unreachable). Each broker's state is in the body."""
    readiness = Readiness([BROKER, OTHER], stale=15)
    assert readiness.verdict(99).detail["reasons"] == [
        "127.0.0.1:9092: not checked yet",
        "broker-2:9092: not checked yet",
    ]
    readiness.answered(BROKER, 100, 0.002)
    first = readiness.verdict(100)
    assert first.ok and [u["ok"] for u in first.detail["upstreams"]] == [True, False]
    readiness.answered(OTHER, 101, 0.004)
    verdict = readiness.verdict(115)
    assert verdict.ok and verdict.detail["ready"] is True and "reasons" not in verdict.detail
    assert verdict.detail["upstreams"][0] == {
        "upstream": "127.0.0.1:9092",
        "ok": True,
        "last_answer_seconds_ago": 15,
        "answer_seconds": 0.002,
    }
    assert json.loads(verdict.body()) == verdict.detail
    assert readiness.verdict(115.5).ok  # the other still answered within the limit
    late = readiness.verdict(116.5)
    assert not late.ok
    assert late.detail["reasons"] == [
        "127.0.0.1:9092: no ApiVersions answer for 16.5 s (limit 15 s)",
        "broker-2:9092: no ApiVersions answer for 15.5 s (limit 15 s)",
    ]


def test_a_failed_check_is_named_but_a_recent_answer_still_counts():
    readiness = Readiness([BROKER], stale=15)
    readiness.answered(BROKER, 100, 0.001)
    readiness.failed(BROKER, 105, "cannot connect: Connection refused")
    still = readiness.verdict(106)
    assert still.ok and still.detail["upstreams"][0]["last_error"] == "cannot connect: Connection refused"
    gone = readiness.verdict(116)
    assert gone.detail["reasons"] == [
        "127.0.0.1:9092: no ApiVersions answer for 16.0 s (limit 15 s); "
        "last check: cannot connect: Connection refused"
    ]
    readiness.answered(BROKER, 117, 0.001)
    back = readiness.verdict(117)
    assert back.ok and "last_error" not in back.detail["upstreams"][0]


def test_never_answered_says_how_the_checks_fail():
    readiness = Readiness([BROKER], stale=15)
    readiness.failed(BROKER, 1, "no answer within 5 s")
    assert readiness.verdict(2).detail["reasons"] == [
        "127.0.0.1:9092: never answered ApiVersions: no answer within 5 s"
    ]


def test_draining_is_never_ready():
    readiness = Readiness([BROKER], stale=15)
    readiness.answered(BROKER, 100, 0.001)
    readiness.start_draining()
    verdict = readiness.verdict(100)
    assert not verdict.ok and verdict.detail["draining"] is True
    assert verdict.detail["reasons"] == ["draining: the proxy takes no new connections"]
