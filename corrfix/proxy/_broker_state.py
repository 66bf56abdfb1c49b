"""``--broker-state FILE``: the brokers the proxy has learned, kept across its restarts.

A broker's listener opens when an answer first names the broker. A client that learned the
listeners before a restart, and never goes back to its bootstrap servers (kafka-python; the
Java client unless ``metadata.recovery.strategy=rebootstrap``), reconnects to them and would
find nothing listening. So every time the router learns something new, the file is written
whole under another name and renamed, and the next start opens the same listeners, relaying
where they relayed, before it accepts anyone. A missing file is a first start; a file that
cannot be read or understood is logged and started without.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any

import structlog

from corrfix.core import Address, ClusterRouter

STATE_VERSION = 1
log = structlog.get_logger("corrfix.proxy")

Learned = dict[int, tuple[Address | None, int]]
"""Node id -> (where its listener relays, None for the bootstrap brokers; the listener's port)."""


class BrokerStateError(ValueError):
    """The file exists but is not one this proxy wrote."""


def read_broker_state(path: Path) -> Learned:
    """What an earlier run learned; empty when there is no file yet."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise BrokerStateError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
        if data.get("version") != STATE_VERSION:
            raise BrokerStateError(f"{path} has version {data.get('version')!r}, not {STATE_VERSION}")
        return {
            int(b["node_id"]): (_upstream(b["upstream"]), _port(b["listener_port"])) for b in data["brokers"]
        }
    except BrokerStateError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise BrokerStateError(f"{path} is not a broker state file: {exc!r}") from exc


def _upstream(value: Any) -> Address | None:
    return None if value is None else Address.parse(str(value))


def _port(value: Any) -> int:
    if not isinstance(value, int) or not 0 < value < 65536:
        raise ValueError(f"listener port {value!r}")
    return value


def _encode(learned: Learned) -> str:
    brokers = [
        {"node_id": node_id, "upstream": None if upstream is None else str(upstream), "listener_port": port}
        for node_id, (upstream, port) in sorted(learned.items())
    ]
    return json.dumps({"version": STATE_VERSION, "brokers": brokers}, indent=1) + "\n"


class BrokerState:
    """Restores a router from the file at start, and writes the file as the router learns."""

    def __init__(self, path: Path, router: ClusterRouter) -> None:
        self.path = path
        self.router = router
        self._lock = threading.Lock()  # the engine's thread and trio's both relay answers
        self._failing: str | None = None

    def restore(self) -> None:
        """Open the listeners the file names (call before accepting clients); from then on,
        write the file whenever the router learns something new."""
        self.router.on_change = self.save
        try:
            learned = read_broker_state(self.path)
        except BrokerStateError as exc:
            log.warning("broker state not restored", path=str(self.path), error=str(exc))
            return
        failed = self.router.restore(learned)
        for node_id, reason in failed.items():
            log.warning("broker listener not restored", node_id=node_id, error=reason)
        if learned:
            log.info("brokers restored", path=str(self.path), brokers=len(learned) - len(failed))

    def save(self) -> None:
        """Write what the router has learned: whole, under another name, then renamed, so a
        crash mid-write leaves the last complete file. A file that cannot be written is logged
        once per error, and the proxy goes on (it only loses the next start's head start)."""
        with self._lock:
            text = _encode(self.router.learned())
            partial = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            try:
                partial.write_text(text, encoding="utf-8")
                os.replace(partial, self.path)
            except OSError as exc:
                error = exc.strerror or str(exc)
                if error != self._failing:
                    log.warning("broker state not written", path=str(self.path), error=error)
                self._failing = error
                with contextlib.suppress(OSError):
                    partial.unlink(missing_ok=True)
                return
            if self._failing is not None:
                log.info("broker state written again", path=str(self.path))
                self._failing = None
