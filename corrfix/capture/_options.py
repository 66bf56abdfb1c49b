"""The ``--capture-*`` options of ``corrfix proxy``, without loading the capture writer.

The proxy reads them on every start; pyarrow and numpy load only when ``--capture-dir``
asks for a capture (:func:`capture_writer_from_args`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from corrfix import _argtypes as argtypes

if TYPE_CHECKING:
    from corrfix.capture._writer import CaptureWriter

DEFAULT_SNAPLEN = 65536
DEFAULT_ROTATE_BYTES = 256 * 1024 * 1024
DEFAULT_ROTATE_SECONDS = 3600.0
DEFAULT_QUEUE_ROWS = 100_000
DEFAULT_QUEUE_BYTES = 64 * 1024 * 1024
DEFAULT_FLUSH_SECONDS = 1.0


def add_capture_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--capture-*`` options of ``corrfix proxy``."""
    group = parser.add_argument_group("capture (Arrow IPC files of both sides; docs/capture-format.md)")
    group.add_argument("--capture-dir", type=Path, default=None, metavar="DIR", help="capture into DIR")
    group.add_argument(
        "--capture-snaplen",
        type=argtypes.size,
        default=DEFAULT_SNAPLEN,
        metavar="BYTES",
        help=f"bytes kept of each frame, size prefix included; 0 keeps only the Kafka header "
        f"(default {DEFAULT_SNAPLEN})",
    )
    group.add_argument(
        "--capture-rotate-bytes",
        type=argtypes.positive_size,
        default=DEFAULT_ROTATE_BYTES,
        metavar="BYTES",
        help="start a new file after this many bytes (default 256M)",
    )
    group.add_argument(
        "--capture-rotate-seconds",
        type=argtypes.positive,
        default=DEFAULT_ROTATE_SECONDS,
        metavar="SECONDS",
        help=f"start a new file after this long (default {DEFAULT_ROTATE_SECONDS:g})",
    )
    group.add_argument(
        "--capture-max-bytes",
        type=argtypes.positive_size,
        default=None,
        metavar="BYTES",
        help="keep DIR's capture files within this many bytes: the oldest are removed, as in "
        "tcpdump's ring buffer; at least --capture-rotate-bytes (default: none removed)",
    )
    group.add_argument(
        "--capture-queue-rows",
        type=argtypes.positive_size,
        default=DEFAULT_QUEUE_ROWS,
        metavar="N",
        help=f"rows waiting to be written before further rows are dropped and counted as lost "
        f"(default {DEFAULT_QUEUE_ROWS})",
    )
    group.add_argument(
        "--capture-queue-bytes",
        type=argtypes.positive_size,
        default=DEFAULT_QUEUE_BYTES,
        metavar="BYTES",
        help="the same bound in bytes of frame copies (default 64M)",
    )
    group.add_argument(
        "--capture-flush-seconds",
        type=argtypes.positive,
        default=DEFAULT_FLUSH_SECONDS,
        metavar="SECONDS",
        help=f"longest time before queued rows are written and readable (default {DEFAULT_FLUSH_SECONDS:g})",
    )
    group.add_argument(
        "--capture-keep-page-cache",
        action="store_true",
        help="leave written capture files in the page cache (by default they are dropped from it "
        "once written back, so a capture does not evict what a broker on the same host caches)",
    )


def capture_conflicts(args: argparse.Namespace) -> list[str]:
    """``--capture-*`` settings each valid alone that cannot work together."""
    if args.capture_max_bytes is not None and args.capture_max_bytes < args.capture_rotate_bytes:
        return [
            f"--capture-max-bytes ({args.capture_max_bytes}) must be at least --capture-rotate-bytes "
            f"({args.capture_rotate_bytes}): the file being written is never removed"
        ]
    return []


def capture_writer_from_args(args: argparse.Namespace) -> CaptureWriter | None:
    """The writer the ``--capture-*`` options ask for, not yet started; None without ``--capture-dir``."""
    if args.capture_dir is None:
        return None
    from corrfix.capture._writer import CaptureWriter

    return CaptureWriter(
        args.capture_dir,
        snaplen=args.capture_snaplen,
        rotate_bytes=args.capture_rotate_bytes,
        rotate_seconds=args.capture_rotate_seconds,
        queue_rows=args.capture_queue_rows,
        queue_bytes=args.capture_queue_bytes,
        flush_seconds=args.capture_flush_seconds,
        keep_page_cache=args.capture_keep_page_cache,
        max_bytes=args.capture_max_bytes,
    )
