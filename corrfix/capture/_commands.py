"""The ``corrfix capture`` sub-subcommands of this package, for the CLI to mount.

Usage from ``corrfix/cli.py``::

    capture = subparsers.add_parser("capture", help="inspect and export captures")
    add_capture_commands(capture.add_subparsers(dest="capture_command", required=True))

Each subcommand sets ``run(args) -> int``, as the other commands do.
"""

from __future__ import annotations

import argparse

from corrfix.capture._info import add_info_arguments, run_info
from corrfix.capture.pcap import add_import_command, add_pcapng_arguments, run_pcapng


def add_capture_commands(
    capture_subparsers: argparse._SubParsersAction,
) -> dict[str, argparse.ArgumentParser]:
    """Add ``info``, ``pcapng`` and ``import-pcap``; returns their parsers (for common options)."""
    info = capture_subparsers.add_parser(
        "info",
        help="connections, time span, frames per api, repair events and lost rows of a capture",
        description="Summarise a capture directory written by corrfix proxy --capture-dir.",
    )
    add_info_arguments(info)
    info.set_defaults(run=run_info)
    pcapng = capture_subparsers.add_parser(
        "pcapng",
        help="export a capture as pcapng for Wireshark (both sides, repair events as comments)",
        description="Write a capture as pcapng: one synthesized TCP connection per side of each proxied "
        "connection, nanosecond timestamps, repair events as packet comments. Decode with "
        "tshark -d tcp.port==PORT,kafka.",
    )
    add_pcapng_arguments(pcapng)
    pcapng.set_defaults(run=run_pcapng)
    return {"info": info, "pcapng": pcapng, "import-pcap": add_import_command(capture_subparsers)}
