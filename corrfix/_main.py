"""The ``corrfix`` entry point: ``capture import-pcap`` starts without the proxy's modules.

The full command line (:mod:`corrfix._cli`) imports trio, structlog and the connection core
for the ``proxy`` parser and for logging: a third of a second that an import of a tcpdump
does not use (it logs nothing; its summary goes to stdout). Every other command line goes
to :func:`corrfix._cli.main`.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:2] == ["capture", "import-pcap"]:
        return _import_pcap(args)
    if args[:1] == ["proxy"] and argv is None:
        # Until the proxy handles SIGHUP (a reload), its default action would end the process
        # while it starts, and systemd counts death by SIGHUP as clean: no restart follows.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    from corrfix._cli import main as full_command_line

    return full_command_line(argv)


def add_common(parser: argparse.ArgumentParser) -> None:
    """The logging options every command takes."""
    parser.add_argument("--log-json", action="store_true", help="log one JSON object per line")
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="default: info"
    )


def _import_pcap(argv: list[str]) -> int:
    """``corrfix capture import-pcap``, parsed as the full command line parses it."""
    from corrfix.capture._commands import quiet_when_piped
    from corrfix.capture.pcap import add_import_command

    parser = argparse.ArgumentParser(prog="corrfix")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    capture = commands.add_parser("capture", help="inspect, export and import captures")
    add_common(
        add_import_command(capture.add_subparsers(dest="capture_command", required=True, metavar="COMMAND"))
    )
    args = parser.parse_args(argv)
    try:
        return int(quiet_when_piped(args.run)(args) or 0)
    except KeyboardInterrupt:
        return 130
