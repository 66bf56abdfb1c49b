"""Wireshark's Kafka dissector (tshark) as a second opinion on a pcap, for the import tests.

Tests that need it skip without tshark, unless ``CORRFIX_REQUIRE_TSHARK=1`` (as in CI).
tshark is given the broker ports with ``-d tcp.port==P,kafka`` and reports every Kafka PDU
it dissected, per packet, as JSON (several PDUs of one packet are a list).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.tools import require_tool

TIMEOUT = 120


@dataclass(frozen=True, slots=True)
class TsharkPdu:
    """One Kafka frame as tshark dissected it; ``api_key`` is None for an answer it could not match."""

    packet: int
    stream: int
    client_port: int
    is_response: bool
    frame_length: int  # size prefix included, as in a capture row
    correlation_id: int
    api_key: int | None
    api_version: int | None

    @property
    def direction(self) -> str:
        return "response" if self.is_response else "request"


def require_tshark() -> str:
    """The tshark binary; skips (or fails, see above) without one."""
    return require_tool("tshark", "CORRFIX_REQUIRE_TSHARK", "apt-get install tshark")


def kafka_pdus(pcap: Path, kafka_ports: Collection[int]) -> list[TsharkPdu]:
    """Every Kafka PDU tshark dissects in ``pcap``, in packet order."""
    command = [require_tshark(), "-r", str(pcap), "-Y", "kafka", "-T", "json", "-J", "frame tcp kafka"]
    for port in kafka_ports:
        command += ["-d", f"tcp.port=={port},kafka"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr
    pdus = []
    for packet in json.loads(done.stdout or "[]"):
        layers = packet["_source"]["layers"]
        tcp = layers["tcp"]
        source, destination = int(tcp["tcp.srcport"]), int(tcp["tcp.dstport"])
        is_response = source in kafka_ports
        found = layers.get("kafka", [])
        for pdu in found if isinstance(found, list) else [found]:
            if "kafka.len" not in pdu or "kafka.correlation_id" not in pdu:
                continue
            pdus.append(
                TsharkPdu(
                    packet=int(layers["frame"]["frame.number"]),
                    stream=int(tcp["tcp.stream"]),
                    client_port=destination if is_response else source,
                    is_response=is_response,
                    frame_length=int(pdu["kafka.len"]) + 4,
                    correlation_id=int(pdu["kafka.correlation_id"]),
                    api_key=_int(pdu, "kafka.response_key" if is_response else "kafka.request_key"),
                    api_version=_int(pdu, "kafka.response.version" if is_response else "kafka.api_version"),
                )
            )
    return pdus


def _int(pdu: dict[str, Any], name: str) -> int | None:
    value = pdu.get(name)
    return int(value) if isinstance(value, str) and value.lstrip("-").isdigit() else None
