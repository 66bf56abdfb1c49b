"""The ``corrfix capture import-pcap`` command: arguments, the summary it prints, its exit status.

Exit status 0 when the capture was imported (or was already imported into that directory),
1 when no connection to a Kafka port was found (naming the ports that carried Kafka-like
requests instead, the usual cause being a wrong ``--kafka-port``), 2 when the file cannot
be read or the capture id is taken.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from corrfix.capture.pcap._import import DEFAULT_KAFKA_PORT, ImportStats, import_pcap
from corrfix.capture.pcap._provenance import CaptureIdTakenError
from protocol import DEFAULT_MAX_FRAME_SIZE

EXIT_NOTHING_IMPORTED = 1


def add_import_command(capture_subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``corrfix capture import-pcap``."""
    p = capture_subparsers.add_parser(
        "import-pcap",
        help="convert a tcpdump capture (pcap or pcapng) of Kafka traffic into a corrfix capture",
        description="Reassemble every TCP connection to the Kafka port(s), split it into Kafka frames, "
        "match responses to requests by correlation id, and write one capture file (source=wire) "
        "that `corrfix replay` and the capture tools read. A pcap already imported into DIR is "
        "skipped. Exit status 1 when no connection to a Kafka port was found.",
    )
    p.add_argument("pcap", type=Path, help="pcap or pcapng file (Ethernet, Linux cooked, raw IP, loopback)")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="DIR", help="capture directory")
    p.add_argument(
        "--kafka-port",
        type=int,
        action="append",
        metavar="PORT",
        help=f"the brokers' port; repeat for several (default {DEFAULT_KAFKA_PORT})",
    )
    p.add_argument("--capture-id", help="capture id (default: derived from the pcap's content)")
    p.add_argument("--max-frame-size", type=int, default=DEFAULT_MAX_FRAME_SIZE, metavar="BYTES")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(run=run_import)
    return p


def run_import(args: argparse.Namespace) -> int:
    if not args.pcap.is_file():
        print(f"corrfix: no such capture file: {args.pcap}", file=sys.stderr)
        return 2
    ports = args.kafka_port or [DEFAULT_KAFKA_PORT]
    try:
        stats = import_pcap(
            args.pcap, args.output, ports, capture_id=args.capture_id, max_frame_size=args.max_frame_size
        )
    except CaptureIdTakenError as exc:
        print(f"corrfix: {exc}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:  # dpkt raises ValueError for a file that is no capture
        print(f"corrfix: cannot import {args.pcap}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(asdict(stats), indent=2))
    elif stats.already_imported is None:
        print(summary(stats))
    if stats.already_imported is not None:
        print(
            f"corrfix: {args.pcap} was already imported into {args.output} as capture {stats.capture_id} "
            f"({Path(stats.already_imported).name}); nothing written",
            file=sys.stderr,
        )
        return 0
    if hint := port_hint(stats, ports):
        print(f"corrfix: {hint}", file=sys.stderr)
    return EXIT_NOTHING_IMPORTED if not stats.connections else 0


def port_hint(stats: ImportStats, kafka_ports: list[int]) -> str | None:
    """What to say about the ports: nothing found on them, or Kafka-like requests elsewhere."""
    asked = ", ".join(str(p) for p in kafka_ports)
    elsewhere = ", ".join(
        f"{port} ({count:,} segments)"
        for port, count in sorted(stats.kafka_like_ports.items(), key=lambda item: -item[1])
    )
    if not stats.connections:
        if elsewhere:
            return (
                f"no connection to Kafka port(s) {asked}; Kafka-like requests went to port(s) "
                f"{elsewhere}: try --kafka-port with those"
            )
        return f"no connection to Kafka port(s) {asked}, and no Kafka-like requests to any other port"
    if elsewhere:
        return f"Kafka-like requests also went to port(s) {elsewhere}, not imported (add --kafka-port)"
    return None


def summary(stats: ImportStats) -> str:
    lines = [
        f"capture {stats.capture_id}: {', '.join(stats.files) or 'no rows, no file written'}",
        f"  packets {stats.packets:,}, TCP {stats.tcp_segments:,}, on Kafka ports {stats.kafka_segments:,}",
        f"  connections {stats.connections:,}, requests {stats.requests:,}, responses {stats.responses:,} "
        f"({stats.unmatched_responses:,} unmatched, {stats.latency_unknown:,} after a capture hole)",
    ]
    if stats.gap_bytes or stats.skipped_bytes or stats.truncated_frames:
        lines.append(
            f"  not captured: {stats.gap_bytes:,} bytes; not framable: {stats.skipped_bytes:,} bytes; "
            f"truncated frames: {stats.truncated_frames:,}"
        )
    if stats.unsupported_link_types:
        lines.append(f"  skipped packets of unsupported link types: {stats.unsupported_link_types}")
    if stats.ip_fragments:
        lines.append(f"  skipped IP fragments: {stats.ip_fragments:,}")
    if stats.truncated_file:
        lines.append("  the file, or a section of it, ends inside a packet (tcpdump running, or killed?)")
    return "\n".join(lines)
