"""HandoffLock: a waiting thread gets the lock at its busy owner's next step, and only then."""

from __future__ import annotations

import threading
import time

from corrfix.proxy._handoff import HandoffLock

HANG_GUARD = 10.0
"""Bounds the waits below; they end as soon as their condition holds."""


def _until(predicate) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.001)


def test_with_nobody_waiting_the_owner_keeps_the_lock():
    lock = HandoffLock()
    with lock.raw:
        assert not lock.yield_to_waiters()
        assert lock.raw.locked() and lock.waiting == 0


def test_a_waiter_has_had_the_lock_when_the_owners_yield_returns():
    lock = HandoffLock()
    inside: list[str] = []

    def waiter() -> None:
        with lock:
            inside.append("waiter")

    with lock.raw:
        thread = threading.Thread(target=waiter)
        thread.start()
        _until(lambda: lock.waiting == 1)
        assert inside == []  # the owner holds it: the waiter waits
        assert lock.yield_to_waiters()
        assert inside == ["waiter"] and lock.raw.locked()  # it ran, and the owner holds it again
        assert not lock.yield_to_waiters()
    thread.join(HANG_GUARD)
    assert not thread.is_alive()


def test_a_lock_taken_while_the_owner_is_away_is_not_counted_as_waiting():
    lock = HandoffLock()
    with lock:
        assert lock.waiting == 0 and lock.raw.locked()
    assert not lock.raw.locked()
