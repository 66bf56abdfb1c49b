"""A mid-stream variant of a pcapng file: every TCP connection as if the capture began late.

A tcpdump started on a busy broker sees connections already open: no handshake, answers to
requests it never saw. This copies a pcapng file (one section, Ethernet, IPv4, as
``export_pcapng`` writes) without the first ``skip`` packets of each TCP connection,
handshake included, and, for the lossy variant, every ``lose_every``-th packet after that
(a packet the kernel dropped); every other block stays as it was.

The cut falls on a packet boundary, which is a frame boundary in the bench's traffic (one
frame per packet). A cut inside a frame would be as realistic, but tshark's Kafka
dissector does not recover from one (it takes the bytes after the cut for a frame size and
waits for that many bytes: 48 of 18,000 frames decoded on a 20,000-frame pcap), so there
would be nothing to compare with.
"""

from __future__ import annotations

import struct
from pathlib import Path

_EPB = 6
_ETHERNET = 14
_BLOCK = struct.Struct("<II")


def _connection(packet: bytes) -> tuple[bytes, bytes] | None:
    """The TCP connection's two endpoints in a fixed order, or None for another packet."""
    if len(packet) < _ETHERNET + 40 or packet[12:14] != b"\x08\x00" or packet[_ETHERNET + 9] != 6:
        return None
    ip = _ETHERNET
    tcp = ip + (packet[ip] & 0x0F) * 4
    a = packet[ip + 12 : ip + 16] + packet[tcp : tcp + 2]
    b = packet[ip + 16 : ip + 20] + packet[tcp + 2 : tcp + 4]
    return min(a, b), max(a, b)


def write_midstream(source: Path, out: Path, skip: int = 101, lose_every: int = 0) -> int:
    """Write the mid-stream variant of ``source`` to ``out`` (lossy with ``lose_every``);
    returns the packets written."""
    data = source.read_bytes()
    seen: dict[tuple[bytes, bytes], int] = {}
    pieces: list[bytes] = []
    pos = 0
    while pos < len(data):
        block_type, length = _BLOCK.unpack_from(data, pos)
        block = data[pos : pos + length]
        pos += length
        if block_type == _EPB:
            captured = struct.unpack_from("<I", block, 20)[0]
            key = _connection(block[28 : 28 + captured])
            if key is not None:
                number = seen[key] = seen.get(key, -1) + 1
                if number < skip or (lose_every and (number - skip) % lose_every == lose_every - 1):
                    continue
        pieces.append(block)
    out.write_bytes(b"".join(pieces))
    return sum(1 for block in pieces if _BLOCK.unpack_from(block)[0] == _EPB)
