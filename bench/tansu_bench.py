"""Relay on a real broker: a confluent-kafka producer into Tansu, direct, via haproxy, via corrfix.

Each run gets a fresh Tansu (its memory grows with data). Tansu advertises the address
the client bootstraps to, so through haproxy, which cannot rewrite Metadata, the client
still stays on the relay; corrfix rewrites the addresses itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import procstat
import targets
from stats import median, ratio

from corrfix._netutil import free_port
from corrfix.lab import TansuBroker, workload


@contextlib.contextmanager
def _chain(name: str, work: Path) -> Iterator[tuple[str, int | None]]:
    """(bootstrap, pid of the relay) for one fresh Tansu behind ``name``."""
    if name == "direct":
        with TansuBroker() as broker:
            yield broker.bootstrap, None
        return
    if name == "haproxy":
        entry = free_port()
        with TansuBroker(advertised_port=entry) as broker, targets.haproxy(broker.port, work, entry) as relay:
            yield f"127.0.0.1:{relay.port}", relay.pid
        return
    workers = 2 if name == "corrfix-w2" else 1
    with (
        TansuBroker() as broker,
        targets.corrfix(broker.port, work, f"tansu-{name}", workers=workers) as relay,
    ):
        yield f"127.0.0.1:{relay.port}", relay.pid


def run_tansu(work: Path, messages: int, repeats: int, log: object = print) -> dict[str, object]:
    names = ["direct", "haproxy", "corrfix", "corrfix-w2"]
    skipped = {}
    if targets.haproxy_binary() is None:
        names.remove("haproxy")
        skipped["haproxy"] = "haproxy is not installed: baseline skipped"
    rates: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for repeat in range(repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            with _chain(name, work) as (bootstrap, pid):
                workload.create_topic(bootstrap, "bench")
                before = procstat.cpu_seconds(pid) if pid else 0.0
                result = workload.produce_confluent(bootstrap, "bench", messages, acks=1, timeout=120)
                used = procstat.cpu_seconds(pid) - before if pid else float("nan")
                if result.delivered != messages:
                    raise RuntimeError(f"{name}: delivered {result.delivered} of {messages}: {result.errors}")
                rates[name].append(messages / result.elapsed)
                cpu[name].append(used / messages * 1e6)
    summary = {
        n: {"msgs_per_s": round(median(rates[n])), "cpu_us_per_msg": round(median(cpu[n]), 2)} for n in names
    }
    base = summary["direct"]["msgs_per_s"]
    for n in names:
        summary[n]["vs_direct"] = ratio(summary[n]["msgs_per_s"], base)
        if "haproxy" in summary:
            summary[n]["vs_haproxy"] = ratio(summary[n]["msgs_per_s"], summary["haproxy"]["msgs_per_s"])
    log("  " + ", ".join(f"{n} {s['msgs_per_s']:,} msg/s" for n, s in summary.items()))
    return {
        "messages": messages,
        "repeats": repeats,
        "producer": "confluent-kafka acks=1",
        **summary,
        "skipped": skipped,
    }
