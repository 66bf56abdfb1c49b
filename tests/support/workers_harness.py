"""``run_workers`` with stand-in workers, for the supervisor's own logic: run as
``python -m tests.support.workers_harness MODE`` (signals need a process of their own).

Each stand-in says READY=1, exits 0 on SIGTERM, and otherwise exits 1 after its life:
- ``race``: the first worker dies once; SIGTERM arrives while its replacement is started;
- ``occasional``: every worker dies after 0.3 s, with a restart window of 0.5 s: never a
  crash loop. The harness stops the supervisor itself after 14 restarts;
- ``loop``: every worker dies at once: a crash loop, which must stop the proxy;
- ``sighup``: SIGHUP (a log rotation) comes while the worker is still starting, before it
  says READY=1 (a real worker handles signals only once trio runs); SIGTERM follows;
- ``refused``: the first worker dies, and its replacement cannot be made once (fork out of
  process slots); the next try works, and SIGTERM follows;
- ``nofork``: no worker can be made at all.

What the supervisor told systemd is printed last, one message's first line each.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import corrfix.proxy._workers as workers

MODE = sys.argv[1] if len(sys.argv) > 1 else "race"
_popen = subprocess.Popen
calls = 0
told: list[str] = []  # not printed as it is told: a signal handler tells some

WORKER = r"""
import os, signal, socket, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
time.sleep(float(sys.argv[2]))  # starting: SIGHUP's default action still applies
path = os.environ.get("NOTIFY_SOCKET")
if path:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.connect(path.replace("@", "\0", 1))
    s.sendall(b"READY=1")
life = float(sys.argv[1])
end = time.monotonic() + life if life >= 0 else float("inf")
while time.monotonic() < end:
    time.sleep(0.02)
sys.exit(1)
"""


def stand_in(command: list[str], env: dict[str, str] | None = None, **kwargs: Any) -> subprocess.Popen[bytes]:
    global calls
    calls += 1
    if (MODE == "refused" and calls == 2) or MODE == "nofork":
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
    lives = {"race": "0.3" if calls == 1 else "-1", "refused": "0.3" if calls == 1 else "-1"}
    life = {"occasional": "0.3", "loop": "0", "sighup": "-1", **lives}[MODE]
    if MODE == "refused" and calls == 3:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    ready_after = "0"
    if MODE == "sighup":
        ready_after = "1.0"
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGHUP)).start()
        threading.Timer(1.6, os.kill, (os.getpid(), signal.SIGTERM)).start()
    if MODE == "race" and calls == 2:
        os.kill(os.getpid(), signal.SIGTERM)  # handled inside this call, before Popen returns
    if MODE == "occasional" and calls == 15:
        os.kill(os.getpid(), signal.SIGTERM)  # enough: 14 restarts without a stop
    process = _popen([sys.executable, "-c", WORKER, life, ready_after], env=env, **kwargs)
    print(f"started worker {calls}", flush=True)
    return process


def tell_systemd(message: str, environ: object = None) -> bool:
    told.append(message.split("\n")[0])
    return True


if __name__ == "__main__":
    workers.subprocess.Popen = stand_in  # type: ignore[misc]
    workers.notify = tell_systemd
    if MODE == "occasional":
        workers.RESTART_WINDOW = 0.5
    began = time.monotonic()
    code = workers.run_workers([], 1, None)
    print(f"returned {code} after {time.monotonic() - began:.1f} s, {calls} starts", flush=True)
    print(f"told systemd {told}", flush=True)
