"""Wire captures: import a tcpdump into the capture format, export a capture as pcapng.

TCP reassembly and frame boundaries for captures taken without corrfix live here too.
"""

from __future__ import annotations

from ._import import CaptureRowWriter, ImportStats, WireImporter, import_pcap
from ._import_command import add_import_command
from ._packet_table import read_segments
from ._packets import (
    LINKTYPE_ETHERNET,
    LINKTYPE_LINUX_SLL,
    LINKTYPE_LINUX_SLL2,
    LINKTYPE_LOOP,
    LINKTYPE_NULL,
    LINKTYPE_RAW,
    TcpSegment,
)
from ._pcapng import add_pcapng_arguments, export_pcapng, run_pcapng
from ._provenance import CaptureIdTakenError
from ._tcp_stream import Data, Gap, StreamReassembler
from ._wire_frames import FrameSplitter, RequestBoundary, ResponseBoundary

__all__ = [
    "LINKTYPE_ETHERNET",
    "LINKTYPE_LINUX_SLL",
    "LINKTYPE_LINUX_SLL2",
    "LINKTYPE_LOOP",
    "LINKTYPE_NULL",
    "LINKTYPE_RAW",
    "CaptureIdTakenError",
    "CaptureRowWriter",
    "Data",
    "FrameSplitter",
    "Gap",
    "ImportStats",
    "RequestBoundary",
    "ResponseBoundary",
    "StreamReassembler",
    "TcpSegment",
    "WireImporter",
    "add_import_command",
    "add_pcapng_arguments",
    "export_pcapng",
    "import_pcap",
    "read_segments",
    "run_pcapng",
]
