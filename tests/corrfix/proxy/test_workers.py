"""The supervisor's side of ``--workers``: where each worker says it serves, which endpoint a
worker serves, and the supervisor's health while a worker starts or has drained."""

from __future__ import annotations

import os

from corrfix.core import Address
from corrfix.proxy._systemd import READY, endpoint, notify
from corrfix.proxy._workers import (
    OWN_ENDPOINT,
    WORKER_ENDPOINT_VARIABLE,
    WorkerNotifications,
    WorkersHealth,
    endpoints_to_serve,
    overdue,
)

METRICS, ADMIN = Address("0.0.0.0", 9100), Address("127.0.0.1", 9101)


def test_a_worker_s_endpoint_is_read_from_its_ready_message_and_bad_ones_are_skipped():
    notifications = WorkerNotifications()
    try:
        environment = notifications.worker_environment()
        me = os.getpid()
        assert notify("X_CORRFIX_ENDPOINT=not an address", environment)
        assert notify(f"{READY}\n{endpoint(Address('127.0.0.1', 4321))}", environment)
        assert notifications.wait_ready(5.0, {me})  # the kernel names the sender
        assert notifications.endpoints == {me: Address("127.0.0.1", 4321)}
        assert notifications.said_ready(me)
        assert notify(f"{READY}\n{endpoint(Address('127.0.0.1', 4322))}", environment)  # a reload
        notifications.wait_ready(5.0, {me})
        assert notifications.endpoints == {me: Address("127.0.0.1", 4322)}
    finally:
        notifications.close()


def test_a_worker_that_exited_is_forgotten_and_its_late_messages_dropped():
    notifications = WorkerNotifications()
    try:
        environment = notifications.worker_environment()
        me = os.getpid()
        assert notify(f"{READY}\n{endpoint(Address('127.0.0.1', 4321))}", environment)
        notifications.wait_ready(5.0, {me})
        notifications.forget(me)  # its pid may come back as another process's
        assert notifications.endpoints == {} and not notifications.said_ready(me)
        assert notify(f"{READY}\n{endpoint(Address('127.0.0.1', 4321))}", environment)
        notifications.wait_ready(5.0, {me + 1})  # read while the exited pid is no worker's
        assert notifications.endpoints == {} and not notifications.said_ready(me)
    finally:
        notifications.close()


def test_a_worker_serves_one_endpoint_of_its_own_whatever_the_user_asked():
    notifications = WorkerNotifications()
    try:
        metrics_worker = notifications.worker_environment("metrics")
        admin_worker = notifications.worker_environment("admin")
        plain_worker = notifications.worker_environment()
    finally:
        notifications.close()
    assert endpoints_to_serve(METRICS, ADMIN, metrics_worker) == (OWN_ENDPOINT, None)
    assert endpoints_to_serve(METRICS, ADMIN, admin_worker) == (None, OWN_ENDPOINT)
    assert WORKER_ENDPOINT_VARIABLE not in plain_worker
    assert endpoints_to_serve(METRICS, ADMIN, {}) == (METRICS, ADMIN)  # not a worker


def test_a_worker_that_does_not_say_ready_in_time_is_overdue():
    started, ready = [100.0, 100.0, 150.0], [True, False, False]
    assert overdue(started, ready, now=161.0, timeout=60.0) == [1]
    assert overdue(started, ready, now=159.0, timeout=60.0) == []
    assert overdue(started, ready, now=211.0, timeout=60.0) == [1, 2]


def test_a_worker_starting_or_drained_keeps_the_supervisor_live_but_not_ready():
    health = WorkersHealth(["starting", "exited"])
    live, ready = health.live(), health.ready()
    assert live.ok and [answer["state"] for answer in live.detail["live"]] == ["starting", "exited"]
    assert not ready.ok and ready.detail["workers"][0]["error"] == "starting: no endpoint"


def test_a_worker_that_does_not_answer_makes_the_supervisor_not_live():
    with_a_closed_port = WorkersHealth([Address("127.0.0.1", 1)])
    assert not with_a_closed_port.live().ok
