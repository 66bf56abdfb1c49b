"""The supervisor's side of ``--workers``: where each worker says it serves, and its health
while a worker starts."""

from __future__ import annotations

import os

from corrfix.core import Address
from corrfix.proxy._systemd import READY, endpoint, notify
from corrfix.proxy._workers import WorkerNotifications, WorkersHealth


def test_a_worker_s_endpoint_is_read_from_its_notification_and_bad_ones_are_skipped():
    notifications = WorkerNotifications()
    try:
        environment = notifications.worker_environment()
        me = os.getpid()
        assert notify("X_CORRFIX_ENDPOINT=not an address", environment)
        assert notify(f"{endpoint(Address('127.0.0.1', 4321))}\n{READY}", environment)
        assert notifications.wait_ready(5.0, {me})  # the kernel names the sender
        assert notifications.endpoints == {me: Address("127.0.0.1", 4321)}
        assert notify(endpoint(Address("127.0.0.1", 4322)), environment)  # a later one wins
        notifications.wait_ready(5.0, {me})
        assert notifications.endpoints == {me: Address("127.0.0.1", 4322)}
    finally:
        notifications.close()


def test_a_worker_that_exited_is_forgotten():
    notifications = WorkerNotifications()
    try:
        environment = notifications.worker_environment()
        me = os.getpid()
        assert notify(f"{READY}\n{endpoint(Address('127.0.0.1', 4321))}", environment)
        assert notifications.wait_ready(5.0, {me})
        notifications.forget(me)  # its pid may come back as another process's
        assert notifications.endpoints == {}
    finally:
        notifications.close()


def test_a_worker_being_started_keeps_the_supervisor_live_but_not_ready():
    health = WorkersHealth([None])
    live, ready = health.live(), health.ready()
    assert live.ok and live.detail["live"][0]["starting"] is True
    assert not ready.ok and ready.detail["workers"][0]["error"] == "starting: no endpoint yet"
