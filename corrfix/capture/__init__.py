"""Capture: both sides of every proxied connection and every repair, as Arrow IPC streams.

:mod:`corrfix.capture.format` is the contract the audit reads by. The rest (recording,
the writer, the reader, ``capture info`` and :mod:`corrfix.capture.pcap`) loads on first
use, so importing the contract costs pyarrow and nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corrfix._lazy import lazy_exports

if TYPE_CHECKING:
    from ._commands import add_capture_commands
    from ._files import CaptureFiles, capture_stem
    from ._info import capture_info, render_info
    from ._options import add_capture_arguments, capture_conflicts, capture_writer_from_args
    from ._recorder import Recorder
    from ._summary import SUMMARY_SUFFIX, CaptureSummary, read_summaries, write_summary
    from ._writer import CaptureWriter
    from .format import CaptureFormatError, capture_files, iter_batches, read_capture

_HOMES = {
    "add_capture_commands": "._commands",
    "CaptureFiles": "._files",
    "capture_stem": "._files",
    "capture_info": "._info",
    "render_info": "._info",
    "CaptureFormatError": ".format",
    "capture_files": ".format",
    "iter_batches": ".format",
    "read_capture": ".format",
    "Recorder": "._recorder",
    "SUMMARY_SUFFIX": "._summary",
    "CaptureSummary": "._summary",
    "read_summaries": "._summary",
    "write_summary": "._summary",
    "CaptureWriter": "._writer",
    "add_capture_arguments": "._options",
    "capture_writer_from_args": "._options",
    "capture_conflicts": "._options",
}

__all__ = [
    "SUMMARY_SUFFIX",
    "CaptureFiles",
    "CaptureFormatError",
    "CaptureSummary",
    "CaptureWriter",
    "Recorder",
    "add_capture_arguments",
    "add_capture_commands",
    "capture_conflicts",
    "capture_files",
    "capture_info",
    "capture_stem",
    "capture_writer_from_args",
    "iter_batches",
    "read_capture",
    "read_summaries",
    "render_info",
    "write_summary",
]


__getattr__ = lazy_exports(__name__, _HOMES)
