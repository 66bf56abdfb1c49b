"""The supervisor's side of ``--workers``: where each worker says it serves."""

from __future__ import annotations

import os

from corrfix.core import Address
from corrfix.proxy._systemd import READY, endpoint, notify
from corrfix.proxy._workers import WorkerNotifications


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
