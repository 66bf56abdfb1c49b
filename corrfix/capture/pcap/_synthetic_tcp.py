"""Synthesize the Ethernet/IPv4/TCP packets of one TCP connection from its byte stream.

Wireshark follows and reassembles a stream only if it looks like real TCP: a handshake,
sequence and acknowledgement numbers that add up in both directions, and segments that
fit in an IPv4 packet. This produces exactly that, with valid checksums, for payloads
handed over in order. Both SYNs offer window scaling, so large unacknowledged transfers
do not look like a full receive window.
"""

from __future__ import annotations

import struct
import sys
from array import array
from dataclasses import dataclass

MAX_SEGMENT = 65535 - 20 - 20
"""Largest TCP payload in one IPv4 packet (no IP or TCP options on data segments)."""
_WINDOW = 65535
_WINDOW_SHIFT = 14
_FIN, _SYN, _PSH, _ACK = 0x01, 0x02, 0x08, 0x10
_ETHERTYPE_IPV4 = 0x0800
_TTL = 64
_PROTO_TCP = 6


@dataclass(frozen=True, slots=True)
class Endpoint:
    ip: bytes  # 4 bytes
    port: int

    @property
    def mac(self) -> bytes:
        """A locally administered MAC derived from the address, stable per endpoint."""
        return b"\x02\x00" + self.ip

    def __str__(self) -> str:
        return f"{'.'.join(str(b) for b in self.ip)}:{self.port}"


def _checksum(*parts: bytes) -> int:
    """The Internet checksum (RFC 1071) of the concatenated parts, as a big-endian number."""
    data = b"".join(parts)
    if len(data) % 2:
        data += b"\x00"
    total = sum(array("H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    if sys.byteorder == "little":  # summed in host order: swap back (RFC 1071, byte order independence)
        total = ((total & 0xFF) << 8) | (total >> 8)
    return ~total & 0xFFFF


class _Half:
    """One direction of the connection: who sends, its next sequence number, its IP ids."""

    __slots__ = ("ip_id", "next_seq", "source", "target")

    def __init__(self, source: Endpoint, target: Endpoint, isn: int) -> None:
        self.source = source
        self.target = target
        self.next_seq = isn
        self.ip_id = 0


class TcpConnection:
    """One synthesized TCP connection between ``client`` (active opener) and ``server``."""

    def __init__(self, client: Endpoint, server: Endpoint, client_isn: int, server_isn: int) -> None:
        self.client = client
        self.server = server
        self._up = _Half(client, server, client_isn)
        self._down = _Half(server, client, server_isn)
        self.opened = False
        self.closed = False

    def handshake(self) -> list[bytes]:
        """SYN, SYN-ACK, ACK."""
        self.opened = True
        up, down = self._up, self._down
        mss = struct.pack("!BBH", 2, 4, MAX_SEGMENT)
        scale = struct.pack("!BBBB", 1, 3, 3, _WINDOW_SHIFT)  # NOP, window scale
        syn = self._packet(up, down, _SYN, b"", options=mss + scale, ack_number=0)
        up.next_seq += 1
        syn_ack = self._packet(down, up, _SYN | _ACK, b"", options=mss + scale)
        down.next_seq += 1
        return [syn, syn_ack, self._packet(up, down, _ACK, b"")]

    def send(self, from_client: bool, payload: bytes | memoryview) -> list[bytes]:
        """Data segments carrying ``payload``, PSH on the last one."""
        sender, receiver = (self._up, self._down) if from_client else (self._down, self._up)
        view = memoryview(payload)
        packets = []
        for start in range(0, len(view), MAX_SEGMENT):
            chunk = bytes(view[start : start + MAX_SEGMENT])
            last = start + MAX_SEGMENT >= len(view)
            packets.append(self._packet(sender, receiver, _ACK | (_PSH if last else 0), chunk))
            sender.next_seq = (sender.next_seq + len(chunk)) & 0xFFFFFFFF
        return packets

    def close(self) -> list[bytes]:
        """FIN-ACK from the client, FIN-ACK from the server, the client's final ACK."""
        self.closed = True
        up, down = self._up, self._down
        packets = [self._packet(up, down, _FIN | _ACK, b"")]
        up.next_seq += 1
        packets.append(self._packet(down, up, _FIN | _ACK, b""))
        down.next_seq += 1
        packets.append(self._packet(up, down, _ACK, b""))
        return packets

    @staticmethod
    def _packet(
        sender: _Half,
        receiver: _Half,
        flags: int,
        payload: bytes,
        *,
        options: bytes = b"",
        ack_number: int | None = None,
    ) -> bytes:
        src, dst = sender.source, sender.target
        ack = receiver.next_seq if ack_number is None else ack_number
        offset = (20 + len(options)) // 4
        tcp = struct.pack(
            "!HHIIBBHHH",
            src.port,
            dst.port,
            sender.next_seq & 0xFFFFFFFF,
            ack & 0xFFFFFFFF,
            offset << 4,
            flags,
            _WINDOW,
            0,
            0,
        )
        tcp += options
        pseudo = src.ip + dst.ip + struct.pack("!BBH", 0, _PROTO_TCP, len(tcp) + len(payload))
        tcp = tcp[:16] + struct.pack("!H", _checksum(pseudo, tcp, payload)) + tcp[18:]
        total = 20 + len(tcp) + len(payload)
        ip = struct.pack(
            "!BBHHHBBH4s4s", 0x45, 0, total, sender.ip_id, 0x4000, _TTL, _PROTO_TCP, 0, src.ip, dst.ip
        )
        ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
        sender.ip_id = (sender.ip_id + 1) & 0xFFFF
        ethernet = dst.mac + src.mac + struct.pack("!H", _ETHERTYPE_IPV4)
        return ethernet + ip + tcp + payload
