"""A minimal pcapng writer: one section, one interface with nanosecond timestamps, packets
with comments.

Written by hand because the format is small and the export needs exactly three things
that are awkward through dpkt's writer: an exact ``if_tsresol`` of 9 (timestamps in
nanoseconds, as the capture stores them), integer timestamps, and any number of
``opt_comment`` options per packet. Little-endian; see the pcapng specification
(draft-ietf-opsawg-pcapng).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import BinaryIO

LINKTYPE_ETHERNET = 1
_SHB = 0x0A0D0D0A
_IDB = 0x00000001
_EPB = 0x00000006
_BYTE_ORDER_MAGIC = 0x1A2B3C4D
_OPT_END = 0
_OPT_COMMENT = 1
_SHB_USERAPPL = 4
_IF_NAME = 2
_IF_DESCRIPTION = 3
_IF_TSRESOL = 9
TSRESOL_NANOSECONDS = 9


def _option(code: int, value: bytes) -> bytes:
    padding = -len(value) % 4
    return struct.pack("<HH", code, len(value)) + value + b"\x00" * padding


def _options(options: Iterable[tuple[int, bytes]]) -> bytes:
    body = b"".join(_option(code, value) for code, value in options)
    return body + struct.pack("<HH", _OPT_END, 0) if body else b""


def _block(block_type: int, body: bytes) -> bytes:
    length = 12 + len(body)
    return struct.pack("<II", block_type, length) + body + struct.pack("<I", length)


class PcapngWriter:
    """Writes the section and interface headers at once, then one block per packet."""

    def __init__(
        self,
        out: BinaryIO,
        *,
        linktype: int = LINKTYPE_ETHERNET,
        application: str = "corrfix",
        interface: str = "corrfix",
        description: str = "",
    ) -> None:
        self._out = out
        shb = struct.pack("<IHHq", _BYTE_ORDER_MAGIC, 1, 0, -1)
        shb += _options([(_SHB_USERAPPL, application.encode())])
        out.write(_block(_SHB, shb))
        idb_options = [(_IF_NAME, interface.encode()), (_IF_TSRESOL, bytes([TSRESOL_NANOSECONDS]))]
        if description:
            idb_options.append((_IF_DESCRIPTION, description.encode()))
        out.write(_block(_IDB, struct.pack("<HHI", linktype, 0, 0) + _options(idb_options)))
        self.packets = 0

    def packet(self, timestamp_ns: int, data: bytes, comments: Iterable[str] = ()) -> None:
        """One Enhanced Packet Block; ``timestamp_ns`` is nanoseconds since the Unix epoch."""
        header = struct.pack(
            "<IIIII", 0, (timestamp_ns >> 32) & 0xFFFFFFFF, timestamp_ns & 0xFFFFFFFF, len(data), len(data)
        )
        padding = b"\x00" * (-len(data) % 4)
        options = _options((_OPT_COMMENT, text.encode()) for text in comments)
        self._out.write(_block(_EPB, header + data + padding + options))
        self.packets += 1
