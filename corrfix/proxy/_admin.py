"""The HTTP admin listener: ``/metrics``, ``/livez`` and ``/readyz`` on one port.

``--metrics HOST:PORT`` serves all three, ``--admin HOST:PORT`` the two health endpoints.
A stdlib WSGI server in a daemon thread, as prometheus-client's own ``start_http_server``
is, with prometheus-client's WSGI app behind ``/metrics``; the health endpoints answer
200 or 503 with a JSON body that says why (see :mod:`corrfix.proxy._health`). A client that
stays silent is closed after ``REQUEST_TIMEOUT``, so that its thread ends.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from corrfix.core import Address
from corrfix.proxy._health import Verdict

LIVEZ = "/livez"
READYZ = "/readyz"
METRICS = "/metrics"
REQUEST_TIMEOUT = 10.0
"""Seconds a client may take over each read of its request and write of the answer: one that
sends nothing (a half-open connection, a port scan) would hold its thread and socket for ever."""

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class AdminApp:
    """Routes the three paths; anything else is 404."""

    def __init__(
        self,
        live: Callable[[], Verdict],
        ready: Callable[[], Verdict],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._health = {LIVEZ: live, READYZ: ready}
        self._metrics = make_wsgi_app(registry) if registry is not None else None

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        verdict = self._health.get(path)
        if verdict is not None:
            answer = verdict()
            return _respond(start_response, HTTPStatus(answer.status), answer.body(), "application/json")
        if path == METRICS and self._metrics is not None:
            return self._metrics(environ, start_response)
        paths = [*self._health, *([METRICS] if self._metrics is not None else [])]
        return _respond(start_response, HTTPStatus.NOT_FOUND, ("try " + " ".join(paths) + "\n").encode())


def _respond(
    start_response: StartResponse, status: HTTPStatus, body: bytes, content_type: str = "text/plain"
) -> list[bytes]:
    headers = [("Content-Type", f"{content_type}; charset=utf-8"), ("Content-Length", str(len(body)))]
    start_response(f"{status.value} {status.phrase}", headers)
    return [body]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds would flood the log."""

    def handle(self) -> None:
        """A client past its time (``timeout``, set per server) is closed without a traceback."""
        with contextlib.suppress(TimeoutError):
            super().handle()


class AdminServer:
    """One admin listener, served from a daemon thread until :meth:`close`."""

    def __init__(self, address: Address, app: AdminApp, request_timeout: float = REQUEST_TIMEOUT) -> None:
        family = socket.AF_INET6 if ":" in address.host else socket.AF_INET

        class Server(socketserver.ThreadingMixIn, WSGIServer):
            address_family = family
            daemon_threads = True
            allow_reuse_address = True

        class Handler(_QuietHandler):
            timeout = request_timeout

        self._server = make_server(address.host, address.port, app, Server, Handler)
        host, port = self._server.server_address[:2]
        self.address = Address(str(host), int(port))
        self._thread = threading.Thread(target=self._server.serve_forever, name="corrfix-admin", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
