"""Recognise TLS where plaintext Kafka was expected, to name the likely misconfiguration.

A TLS record read as a Kafka frame gives a size whose top bytes are the record type and
the major version 3; a TLS broker built on OpenSSL closes a plaintext connection without
answering anything.
"""

from __future__ import annotations

from protocol import FrameSizeError, ProtocolError

HANDSHAKE_RECORD = 0x16
_TLS_RECORD_TYPES = range(0x14, 0x18)  # change_cipher_spec, alert, handshake, application_data
SILENT_UPSTREAM_HINT = "if the broker is a TLS listener, start corrfix with --upstream-tls"
"""Logged when a plaintext broker connection closes before any answer: TLS brokers built on
OpenSSL close without a word when a request arrives in plaintext."""


def tls_on_plaintext(exc: ProtocolError, side: str) -> str | None:
    """A reason naming TLS, when a frame size error is really a TLS record on a plaintext side.

    ``side`` is "client" (a ClientHello on a plaintext listener) or "upstream" (a TLS
    broker answering a plaintext request, typically with an alert). None otherwise.
    """
    if not isinstance(exc, FrameSizeError) or exc.size < 0:
        return None
    record_type, major = exc.size >> 24, (exc.size >> 16) & 0xFF
    if major != 3 or record_type not in _TLS_RECORD_TYPES:
        return None
    if side == "client":
        if record_type != HANDSHAKE_RECORD:
            return None
        return (
            "TLS handshake on a plaintext listener: the client speaks TLS "
            "(start corrfix with --tls-cert, or use security.protocol=PLAINTEXT)"
        )
    return "the broker answered with a TLS record: it is a TLS listener (start corrfix with --upstream-tls)"
