"""The ``corrfix capture`` sub-subcommands of this package, for the CLI to mount.

Usage from ``corrfix/cli.py``::

    capture = subparsers.add_parser("capture", help="inspect and export captures")
    add_capture_commands(capture.add_subparsers(dest="capture_command", required=True))

Each subcommand sets ``run(args) -> int``, as the other commands do. Their output is made
to be piped: a reader that goes away early (``| head``) ends the command quietly with the
status a SIGPIPE gives (141), not with a BrokenPipeError traceback. A capture ``info`` or
``pcapng`` cannot read (a foreign or newer ``*.arrows`` file in the directory) or a file it
cannot write ends it with one line on stderr and status 2, as ``replay`` does.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
from collections.abc import Callable

from corrfix.capture._info import add_info_arguments, run_info
from corrfix.capture.format import CaptureFormatError
from corrfix.capture.pcap import add_import_command, add_pcapng_arguments, run_pcapng

Run = Callable[[argparse.Namespace], int]
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
EXIT_UNREADABLE = 2


def quiet_when_piped(run: Run) -> Run:
    """``run``, ending quietly when stdout's reader has gone away."""

    @functools.wraps(run)
    def piped(args: argparse.Namespace) -> int:
        try:
            status = run(args)
            sys.stdout.flush()  # a broken pipe shows here, not at exit
        except BrokenPipeError:
            # Python would flush stdout again at exit and complain: point it at /dev/null.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            return EXIT_BROKEN_PIPE
        return status

    return piped


def reporting_unreadable(run: Run) -> Run:
    """``run``, saying in one line why a capture could not be read or its output written:
    an operator gets the file to look at, not a traceback."""

    @functools.wraps(run)
    def reporting(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except BrokenPipeError:
            raise  # stdout's reader went away: quiet_when_piped ends the command
        except (OSError, CaptureFormatError) as exc:
            print(f"corrfix: {exc}", file=sys.stderr)
            return EXIT_UNREADABLE

    return reporting


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
    info.set_defaults(run=reporting_unreadable(run_info))
    pcapng = capture_subparsers.add_parser(
        "pcapng",
        help="export a capture as pcapng for Wireshark (both sides, repair events as comments)",
        description="Write a capture as pcapng: one synthesized TCP connection per side of each proxied "
        "connection, nanosecond timestamps, repair events as packet comments. Decode with "
        "tshark -d tcp.port==PORT,kafka.",
    )
    add_pcapng_arguments(pcapng)
    pcapng.set_defaults(run=reporting_unreadable(run_pcapng))
    commands = {"info": info, "pcapng": pcapng, "import-pcap": add_import_command(capture_subparsers)}
    for parser in commands.values():
        parser.set_defaults(run=quiet_when_piped(parser.get_default("run")))
    return commands
