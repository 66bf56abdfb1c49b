"""``corrfix proxy --workers N``: N proxy processes sharing the listen ports (SO_REUSEPORT).

The kernel spreads new connections over the workers, and a connection lives in one of
them; nothing else about the proxy changes. This supervisor starts the workers, passes
SIGTERM (drain), SIGINT and SIGHUP (re-open files) on to them, restarts a worker that dies
on its own (at most ``MAX_RESTARTS`` within ``RESTART_WINDOW``: a worker crashing in a loop
stops the proxy), and serves one ``/metrics``: counters and histogram buckets summed across the
workers (``_created`` times take the earliest; counters keep what a worker counted before it
restarted, so they never go down), gauges per worker with a ``worker`` label, so that an alert
on one worker's state (an upstream it cannot reach, its connections near the limit) is not
averaged away by the others. Its ``/livez`` and ``/readyz`` ask every worker's own, all at once;
``/readyz`` turns 503 at SIGTERM.
Each worker serves one endpoint of its own, on a loopback port the kernel picks, and says
which along with its READY=1 (a port chosen for it beforehand could be taken by the time it
binds); the user's ``--metrics`` and ``--admin`` addresses are the supervisor's alone. A
worker that has not said READY=1 within ``START_TIMEOUT`` is killed, and restarted like one
that died.
The workers' sd_notify messages come to the supervisor, which tells systemd ``READY=1``
once every worker listens.
"""

from __future__ import annotations

import collections
import concurrent.futures
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import FrameType
from typing import Any, Literal, TypeVar

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from corrfix.core import Address
from corrfix.proxy._admin import LIVEZ, READYZ, AdminApp, AdminServer
from corrfix.proxy._health import Verdict
from corrfix.proxy._logs import reopen_log_file
from corrfix.proxy._systemd import ENDPOINT, NOTIFY_SOCKET, READY, STOPPING, NotifyReceiver, notify, reloading

log = structlog.get_logger("corrfix.workers")
MAX_RESTARTS = 10
RESTART_WINDOW = 60.0
"""Workers that die on their own are restarted, up to ``MAX_RESTARTS`` within this many
seconds: a worker crashing in a loop stops the proxy, occasional deaths over its life do not."""
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
SCRAPE_TIMEOUT = 2.0
POLL_INTERVAL = 0.2
CREATED_SUFFIX = "_created"
START_TIMEOUT = 60.0
"""Seconds a worker may take to listen and say READY=1 before it is killed and restarted."""
WORKER_ENDPOINT_VARIABLE = "_CORRFIX_WORKER_ENDPOINT"
"""Set by the supervisor for its workers: ``metrics`` or ``admin``, the one endpoint a worker
serves of its own (outside the ``CORRFIX_`` settings, so no option, variable or file sets it)."""
OWN_ENDPOINT = Address("127.0.0.1", 0)

Slot = Address | Literal["starting", "exited"]
"""What the supervisor knows of a worker's endpoint: where it serves, or why it serves nowhere."""
_T = TypeVar("_T")


def endpoints_to_serve(
    metrics: Address | None, admin: Address | None, environ: Mapping[str, str] | None = None
) -> tuple[Address | None, Address | None]:
    """The ``--metrics`` and ``--admin`` addresses this process serves: the user's, except in a
    worker, which serves one endpoint of its own on a port the kernel picks."""
    kind = (os.environ if environ is None else environ).get(WORKER_ENDPOINT_VARIABLE)
    if kind == "metrics":
        return OWN_ENDPOINT, None
    if kind == "admin":
        return None, OWN_ENDPOINT
    return metrics, admin


def overdue(started: Sequence[float], ready: Sequence[bool], now: float, timeout: float) -> list[int]:
    """The workers that have not said READY=1 within ``timeout`` of their start."""
    late = zip(started, ready, strict=True)
    return [index for index, (at, said) in enumerate(late) if not said and now - at > timeout]


_SampleKey = tuple[str, str, tuple[tuple[str, str], ...]]
"""A sample's family, name and labels: what is summed across workers."""
_COUNTING = frozenset({"counter", "histogram", "summary"})
"""Families whose samples only ever grow within a process (``_created`` aside, a time)."""


def _combine(sums: dict[_SampleKey, float], key: _SampleKey, value: float) -> None:
    if key[1].endswith(CREATED_SUFFIX):  # a time: the earliest, not a sum
        sums[key] = min(sums.get(key, value), value)
    else:
        sums[key] = sums.get(key, 0.0) + value


WORKER_LABEL = "worker"
"""The label that tells the workers' gauges apart in the supervisor's ``/metrics``: the
worker's index, from 0, which a restarted worker keeps."""


def _ask_all(endpoints: Sequence[Slot], ask: Callable[[Address], _T]) -> list[_T | None]:
    """``ask`` each worker that serves, all at once: one worker that does not answer costs one
    ``SCRAPE_TIMEOUT``, not one per worker. None for a slot with no endpoint."""
    serving = [(index, slot) for index, slot in enumerate(endpoints) if isinstance(slot, Address)]
    answers: list[_T | None] = [None] * len(endpoints)
    if not serving:
        return answers
    with concurrent.futures.ThreadPoolExecutor(len(serving), thread_name_prefix="corrfix-ask") as pool:
        for (index, _), answer in zip(serving, pool.map(ask, [slot for _, slot in serving]), strict=True):
            answers[index] = answer
    return answers


def _fetch_metrics(endpoint: Address) -> list[Metric] | None:
    """A worker's samples; None when it does not answer, or dies while it answers."""
    try:
        with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=SCRAPE_TIMEOUT) as response:
            text = response.read().decode()
        return list(text_string_to_metric_families(text))
    except (OSError, http.client.HTTPException, ValueError):
        # A worker restarting, or killed while it answered (a short read): its counters stay as
        # it said last, and the other workers' are still served.
        return None


class SummedWorkerMetrics(Collector):
    """Scrapes each worker's own endpoint: counters summed, gauges per worker.

    ``endpoints`` is the supervisor's own list, read at each scrape. Prometheus takes any
    decrease of a counter for a reset and counts the whole sum again in ``rate()`` and
    ``increase()``, so summed counters never go down: a worker that does not answer counts
    with what it said last, and what a worker counted before it exited or restarted stays in
    the sum. Gauges are those of the workers that answered, each with its ``worker`` label:
    a sum would hide one worker that cannot reach a broker (``corrfix_upstream_up`` 1 of 2) or
    is near its own ``--max-connections`` while the others are not.
    """

    def __init__(self, endpoints: Sequence[Slot]) -> None:
        self.endpoints = endpoints
        # One scrape at a time: two at once could fold a worker's counts into _retired twice.
        self._lock = threading.Lock()
        self._families: dict[str, tuple[str, str, str]] = {}  # name: documentation, type, unit
        self._counted: dict[Address, dict[_SampleKey, float]] = {}  # per worker, as last scraped
        self._retired: dict[_SampleKey, float] = {}  # counted by workers since gone or restarted

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            sums = self._scrape()
            for counted in [self._retired, *self._counted.values()]:
                for key, value in counted.items():
                    _combine(sums, key, value)
            families = dict(self._families)
        merged: dict[str, Metric] = {}
        for (family_name, sample_name, labels), value in sums.items():
            metric = merged.get(family_name)
            if metric is None:
                metric = merged[family_name] = Metric(family_name, *families[family_name])
            metric.add_sample(sample_name, dict(labels), value)
        yield from merged.values()

    def _scrape(self) -> dict[_SampleKey, float]:
        """Scrape every worker; returns the gauges, by worker, and keeps each worker's counters."""
        slots = list(self.endpoints)
        serving = {slot for slot in slots if isinstance(slot, Address)}
        for gone in self._counted.keys() - serving:  # exited, or restarted elsewhere
            for key, value in self._counted.pop(gone).items():
                _combine(self._retired, key, value)
        gauges: dict[_SampleKey, float] = {}
        for index, (endpoint, parsed) in enumerate(zip(slots, _ask_all(slots, _fetch_metrics), strict=True)):
            if parsed is None or not isinstance(endpoint, Address):
                continue
            counted = self._counted.setdefault(endpoint, {})
            for family in parsed:
                self._families.setdefault(family.name, (family.documentation, family.type, family.unit))
                for sample in family.samples:
                    labels = tuple(sorted(sample.labels.items()))
                    if family.type not in _COUNTING:
                        worker = tuple(sorted({**sample.labels, WORKER_LABEL: str(index)}.items()))
                        gauges[(family.name, sample.name, worker)] = sample.value
                        continue
                    key = (family.name, sample.name, labels)
                    last = counted.get(key)
                    if last is not None and sample.value < last:  # a new worker on the same port
                        _combine(self._retired, key, last)
                    counted[key] = sample.value
        return gauges


class WorkersHealth:
    """``/livez`` and ``/readyz`` of the supervisor: every worker's own answer, and the drain."""

    def __init__(self, endpoints: Sequence[Slot]) -> None:
        self.endpoints = endpoints  # the supervisor's own list, as in SummedWorkerMetrics
        self.draining = False

    def live(self) -> Verdict:
        """Live while every worker is, is being started (within ``START_TIMEOUT``), or has
        finished its drain: restarting the supervisor for a worker it is starting itself
        would only cost the other workers' connections."""
        answers = self._ask(LIVEZ)
        live = all(a["status"] == 200 or a.get("state") in ("starting", "exited") for a in answers)
        return Verdict(live, {"live": answers})

    def ready(self) -> Verdict:
        if self.draining:
            return Verdict(False, {"ready": False, "draining": True, "reasons": ["draining"]})
        answers = self._ask(READYZ)
        ok = all(a["status"] == 200 for a in answers)
        return Verdict(ok, {"ready": ok, "draining": False, "workers": answers})

    def _ask(self, path: str) -> list[dict[str, Any]]:
        slots = list(self.endpoints)
        answers = _ask_all(slots, lambda endpoint: _ask_one(endpoint, path))
        return [
            {"worker": index, **answer}
            if answer is not None
            else {"worker": index, "status": None, "state": slot, "error": f"{slot}: no endpoint"}
            for index, (slot, answer) in enumerate(zip(slots, answers, strict=True))
        ]


def _ask_one(endpoint: Address, path: str) -> dict[str, Any]:
    """One worker's answer to ``/livez`` or ``/readyz``: its status and body, or why none came."""
    try:
        with urllib.request.urlopen(f"http://{endpoint}{path}", timeout=SCRAPE_TIMEOUT) as response:
            return {"status": response.status, "detail": json.loads(response.read())}
    except urllib.error.HTTPError as exc:
        try:
            return {"status": exc.code, "detail": json.loads(exc.read() or b"null")}
        except (OSError, http.client.HTTPException, ValueError):
            return {"status": exc.code, "detail": None}  # the verdict, without its body
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return {"status": None, "error": f"no answer: {exc!r}"}


class WorkerNotifications:
    """The workers' sd_notify messages: where each serves, and READY=1 once they all listen."""

    def __init__(self) -> None:
        self._receiver = NotifyReceiver()
        self._ready: set[int] = set()
        self.announced = False
        """Every worker has said READY=1 (once), so the supervisor said it to systemd."""
        self.endpoints: dict[int, Address] = {}
        """Per worker pid, where it said it serves."""

    def forget(self, pid: int) -> None:
        """A worker exited: its pid may come back as another process's."""
        self.endpoints.pop(pid, None)
        self._ready.discard(pid)

    def said_ready(self, pid: int) -> bool:
        return pid in self._ready

    def worker_environment(self, endpoint_kind: str | None = None) -> dict[str, str]:
        """The environment of a worker: where to notify, and which endpoint to serve if any."""
        environment = {**os.environ, NOTIFY_SOCKET: self._receiver.path}
        environment.pop(WORKER_ENDPOINT_VARIABLE, None)
        if endpoint_kind is not None:
            environment[WORKER_ENDPOINT_VARIABLE] = endpoint_kind
        return environment

    def wait_ready(self, timeout: float, pids: set[int]) -> bool:
        """Wait up to ``timeout`` for messages; True once, when every one of ``pids`` is ready.
        Messages from other pids (a worker that has exited) are dropped."""
        prefix = ENDPOINT + "="
        for pid, lines in self._receiver.receive(timeout):
            if pid not in pids:
                continue
            if READY in lines:
                self._ready.add(pid)
            for line in lines:
                if line.startswith(prefix):
                    try:
                        self.endpoints[pid] = Address.parse(line[len(prefix) :])
                    except ValueError:
                        log.warning("worker sent an unreadable endpoint", pid=pid, message=line)
        if not self.announced and pids <= self._ready:
            self.announced = True
            return True
        return False

    def close(self) -> None:
        self._receiver.close()


def run_workers(
    argv: Sequence[str], workers: int, metrics: Address | None, admin: Address | None = None
) -> int:
    """Run ``corrfix proxy ARGV`` as ``workers`` processes until they all stop."""
    served = metrics is not None or admin is not None
    endpoints: list[Slot] = ["starting"] * workers if served else []
    notifications = WorkerNotifications()
    # A worker's own endpoint serves what the supervisor's does: metrics, or health alone.
    endpoint_kind = ("metrics" if metrics is not None else "admin") if served else None
    command = [sys.executable, "-m", "corrfix", "proxy", *argv, "--workers", "1", "--reuse-port"]
    started = [0.0] * workers  # when each worker was last started

    health = WorkersHealth(endpoints)
    try:
        if metrics is not None:
            registry = CollectorRegistry()
            registry.register(SummedWorkerMetrics(endpoints))
            AdminServer(metrics, AdminApp(health.live, health.ready, registry))
        if admin is not None:
            AdminServer(admin, AdminApp(health.live, health.ready))
    except OSError as exc:
        log.error("cannot start", error=str(exc))
        notifications.close()
        return 2
    processes: list[subprocess.Popen[bytes]] = []
    stopping = False
    stop_signal: int | None = None
    told: set[int] = set()  # workers sent the stop signal
    reopen = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping, stop_signal, reopen
        # systemd hears of a reload only between READY=1 and STOPPING=1, as from one proxy.
        serving = notifications.announced and not stopping
        if signum == signal.SIGHUP:
            if serving:
                notify(reloading())
            reopen = True  # the loop re-opens the log: a handler may interrupt a write to it
        else:
            stopping = True
            stop_signal = signum
            health.draining = True
            notify(STOPPING)
        for process in processes:
            if process.poll() is not None:
                continue
            if signum == signal.SIGHUP and not notifications.said_ready(process.pid):
                continue  # still starting: it opens its files anew, and SIGHUP would kill it
            process.send_signal(signum)
            if signum != signal.SIGHUP:
                told.add(process.pid)
        if signum == signal.SIGHUP and serving:
            notify(READY)

    def start_worker(index: int) -> bool:
        """Start worker ``index``, new or in place of a dead one; one that a stop signal missed
        while it started is told now. False if no process could be made (fork out of memory or
        of process slots): the caller tries again later, or stops."""
        started[index] = time.monotonic()
        try:
            process = subprocess.Popen(command, env=notifications.worker_environment(endpoint_kind))
        except OSError as exc:
            log.error("cannot start a worker", worker=index, error=str(exc))
            return False
        # The list and the check in one step: a stop signal handled before it is seen here, one
        # handled after it finds the process in the list.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)
        try:
            if index < len(processes):
                processes[index] = process
            else:
                processes.append(process)
            if stop_signal is not None and process.pid not in told:
                process.send_signal(stop_signal)
                told.add(process.pid)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return True

    # Before the first worker starts: a signal from then on is forwarded, never the default.
    for signum in _FORWARDED:
        signal.signal(signum, forward)
    start_failed = False
    for index in range(workers):
        if not start_worker(index):  # the workers started are stopped, and so is the proxy
            start_failed = True
            forward(signal.SIGTERM, None)
            break
    log.info("workers started", workers=len(processes), pids=[p.pid for p in processes])
    restarts: collections.deque[float] = collections.deque()  # when workers were restarted
    while True:
        if notifications.wait_ready(POLL_INTERVAL, {p.pid for p in processes}) and not stopping:
            notify(READY)  # every worker listens
        for index, process in enumerate(processes):
            if served and endpoints[index] != "exited":
                endpoints[index] = notifications.endpoints.get(process.pid, "starting")
        if not stopping:
            said = [notifications.said_ready(p.pid) for p in processes]
            for index in overdue(started, said, time.monotonic(), START_TIMEOUT):
                if processes[index].poll() is None:
                    log.warning("worker did not start in time, killing it", worker=index, limit=START_TIMEOUT)
                    processes[index].kill()  # reaped and restarted below, or on the next pass
        if reopen:
            reopen = False
            reopen_log_file()
        alive = [p for p in processes if p.poll() is None]
        if not alive and stopping:
            break
        for index, process in enumerate(processes):
            rc = process.poll()
            if rc is None:
                continue
            if stopping:
                if served:
                    endpoints[index] = "exited"  # drained: nothing to ask it any more
                continue
            now = time.monotonic()
            while restarts and now - restarts[0] > RESTART_WINDOW:
                restarts.popleft()
            if len(restarts) >= MAX_RESTARTS:
                log.error(
                    "worker keeps dying, stopping",
                    worker=index,
                    returncode=rc,
                    restarts=len(restarts),
                    window=RESTART_WINDOW,
                )
                forward(signal.SIGTERM, None)
                break
            restarts.append(now)
            log.warning("worker exited, restarting", worker=index, returncode=rc)
            notifications.forget(process.pid)
            if served:
                endpoints[index] = "starting"
            start_worker(index)  # if it fails, the dead one stays and the next pass tries again
    notifications.close()
    codes = [p.returncode for p in processes]
    log.info("workers stopped", returncodes=codes)
    # A worker still starting dies of the stop signal it is sent (it handles signals once trio
    # runs): it stopped as asked, which is no failure for the supervisor to exit with.
    stopped = {-signal.SIGTERM, -signal.SIGINT}
    failed = [
        code for p, code in zip(processes, codes, strict=True) if code not in stopped or p.pid not in told
    ]
    return max((abs(code) for code in failed if code), default=2 if start_failed else 0)
