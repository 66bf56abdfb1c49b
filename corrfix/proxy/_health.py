"""What ``/livez`` and ``/readyz`` answer, decided from recorded facts and the time.

Sans-IO: the trio side records facts (a heartbeat, the listeners up, an upstream's answer
or failure, the drain) and the HTTP thread asks for a verdict with the current monotonic
time. A lock guards the facts, since the two run in different threads.

* live: the listeners were started, the event loop ran its heartbeat lately, and the relay
  engine's thread is not stuck in one pass. A loop stuck in a long computation, or
  deadlocked, stops beating; an engine pass that does not end stops every plaintext
  connection while the loop beats on. A drain is still live.
* ready: a bootstrap broker (``--upstream`` may name several) answered an ApiVersions
  request within ``stale`` seconds, and the proxy is not draining. Clients bootstrap from
  any of them, as they would given the list themselves, so one broker down leaves the proxy
  ready (its ``corrfix_upstream_up`` says so). A failing verdict names each broker and how.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from corrfix.core import Address

DEFAULT_STALL_LIMIT = 10.0
"""Seconds without a heartbeat after which the event loop counts as stuck."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """An endpoint's answer: 200 when ``ok``, else 503; ``detail`` is the JSON body."""

    ok: bool
    detail: dict[str, Any]

    @property
    def status(self) -> int:
        return 200 if self.ok else 503

    def body(self) -> bytes:
        return (json.dumps(self.detail, indent=1) + "\n").encode()


class Liveness:
    """The heartbeat of the event loop and whether the accept loops run."""

    def __init__(self, stall_limit: float = DEFAULT_STALL_LIMIT) -> None:
        self.stall_limit = stall_limit
        self._lock = threading.Lock()
        self._beat: float | None = None
        self._listening = False
        self._stopped = False

    def beat(self, now: float) -> None:
        with self._lock:
            self._beat = now

    def listening(self) -> None:
        with self._lock:
            self._listening = True

    def stopped(self) -> None:
        with self._lock:
            self._stopped = True

    def verdict(self, now: float, engine_pass: float = 0.0) -> Verdict:
        """``engine_pass``: how long the relay engine's pass in progress has run (0.0 between passes)."""
        with self._lock:
            beat, listening, stopped = self._beat, self._listening, self._stopped
        if stopped:
            return Verdict(False, {"live": False, "reason": "the proxy has stopped serving"})
        if not listening or beat is None:
            return Verdict(False, {"live": False, "reason": "the listeners are not up yet"})
        silent = now - beat
        if silent > self.stall_limit:
            reason = (
                f"the event loop has not run its heartbeat for {silent:.1f} s (limit {self.stall_limit:g} s)"
            )
            return Verdict(False, {"live": False, "reason": reason})
        if engine_pass > self.stall_limit:
            reason = (
                f"the relay engine has been in one pass for {engine_pass:.1f} s"
                f" (limit {self.stall_limit:g} s): its plaintext connections are not served"
            )
            return Verdict(False, {"live": False, "reason": reason})
        return Verdict(True, {"live": True})


@dataclass(frozen=True, slots=True)
class UpstreamCheck:
    """The last answer from one upstream bootstrap, and the last failure since."""

    upstream: Address
    answered_at: float | None = None
    answer_seconds: float | None = None
    failed_at: float | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class _Report:
    ok: bool
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)


class Readiness:
    """Per configured upstream, when it last answered; and whether the proxy drains."""

    def __init__(self, upstreams: Iterable[Address], stale: float) -> None:
        self.stale = stale
        self._lock = threading.Lock()
        self._checks = {upstream: UpstreamCheck(upstream) for upstream in upstreams}
        self._draining = False

    @property
    def upstreams(self) -> list[Address]:
        return list(self._checks)

    def answered(self, upstream: Address, now: float, seconds: float) -> None:
        """``upstream`` answered the ApiVersions request sent ``seconds`` before ``now``."""
        with self._lock:
            check = self._checks[upstream]
            self._checks[upstream] = replace(check, answered_at=now, answer_seconds=seconds, error=None)

    def failed(self, upstream: Address, now: float, error: str) -> None:
        with self._lock:
            self._checks[upstream] = replace(self._checks[upstream], failed_at=now, error=error)

    def start_draining(self) -> None:
        with self._lock:
            self._draining = True

    @property
    def draining(self) -> bool:
        return self._draining

    def check(self, upstream: Address) -> UpstreamCheck:
        with self._lock:
            return self._checks[upstream]

    def checks(self) -> list[UpstreamCheck]:
        with self._lock:
            return list(self._checks.values())

    def up(self, check: UpstreamCheck, now: float) -> bool:
        """Whether ``check``'s upstream answered within ``stale`` seconds of ``now``."""
        return check.answered_at is not None and now - check.answered_at <= self.stale

    def verdict(self, now: float) -> Verdict:
        with self._lock:
            checks, draining = list(self._checks.values()), self._draining
        reports = [self._report(check, now) for check in checks]
        answering = any(report.ok for report in reports)
        failures = [] if answering else [report.reason for report in reports]
        if draining:
            failures.insert(0, "draining: the proxy takes no new connections")
        detail: dict[str, Any] = {
            "ready": not failures,
            "draining": draining,
            "stale_after_seconds": self.stale,
            "upstreams": [report.detail for report in reports],
        }
        if failures:
            detail["reasons"] = failures
        return Verdict(not failures, detail)

    def _report(self, check: UpstreamCheck, now: float) -> _Report:
        name = str(check.upstream)
        detail: dict[str, Any] = {"upstream": name, "ok": self.up(check, now)}
        if check.answered_at is not None:
            detail["last_answer_seconds_ago"] = round(now - check.answered_at, 3)
            detail["answer_seconds"] = round(check.answer_seconds or 0.0, 6)
        if check.error is not None:
            detail["last_error"] = check.error
        if detail["ok"]:
            return _Report(True, "", detail)
        if check.answered_at is None:
            how = f"never answered ApiVersions: {check.error}" if check.error else "not checked yet"
        else:
            how = f"no ApiVersions answer for {now - check.answered_at:.1f} s (limit {self.stale:g} s)"
            if check.error:
                how += f"; last check: {check.error}"
        return _Report(False, f"{name}: {how}", detail)
