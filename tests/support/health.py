"""Helpers for the health tests: HTTP probes, bounded waits on a real process, a held request."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from protocol import ApiKey, request_class
from protocol.testing import encode_request


def probe(url: str) -> tuple[int, Any]:
    """GET ``url``: the status and the JSON body (for 503s too)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll a real process's state until ``condition()`` is truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; last: {result!r}")
        time.sleep(0.05)


def wait_for_status(url: str, status: int, timeout: float = 20.0) -> Any:
    """The body of ``url`` once it answers ``status``."""
    last: list[Any] = []

    def answered() -> bool:
        got, body = probe(url)
        last[:] = [got, body]
        return got == status

    wait_for(answered, timeout, f"{url} to answer {status} (last: {last})")
    return last[1]


def wait_for_draining(base: str, timeout: float = 2.0) -> Any:
    """The ``/readyz`` body once it says 503 because the proxy drains. Not just any 503: on a
    loaded machine a check may already have failed before the signal."""

    def draining() -> Any:
        status, body = probe(f"{base}/readyz")
        return body if status == 503 and body.get("draining") is True else None

    return wait_for(draining, timeout, "/readyz to answer 503, draining")


def held_fetch(address: tuple[str, int], topic: str, max_wait_ms: int) -> socket.socket:
    """A connection with a Fetch outstanding on an empty ``topic``: Tansu holds it ``max_wait_ms``."""
    fetch = request_class(ApiKey.FETCH)
    partition = fetch.FetchTopic.FetchPartition(
        version=4, partition=0, fetch_offset=0, partition_max_bytes=1 << 20
    )
    message = fetch(
        version=4,
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        topics=[fetch.FetchTopic(version=4, topic=topic, partitions=[partition])],
    )
    sock = socket.create_connection(address, timeout=30)
    sock.sendall(encode_request(message, 1))
    return sock
