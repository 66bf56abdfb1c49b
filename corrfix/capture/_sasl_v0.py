"""Which frames of a connection are SASL v0 tokens, decided as the repair machine decides.

After a successful SaslHandshake v0, the client and broker exchange authentication
tokens as bare size-prefixed frames with no Kafka header, and the repair machine passes
them through untouched (``RepairMachine.raw_mode``). The capture must not read their
first bytes as api key and correlation id, and must not store them: they carry
credentials. This follows the same rule as the machine, from the frames alone.
"""

from __future__ import annotations

from protocol import SASL_V0_ROUNDS, ProtocolError, parse_request_header, sasl_mechanism

_UNKNOWN = ""


class SaslTokens:
    """One connection's SASL v0 state; created when a SaslHandshake v0 goes by."""

    __slots__ = ("_mechanism", "_owed", "_rounds", "_to_client", "_to_upstream")

    def __init__(self) -> None:
        self._mechanism: str | None = None  # of a handshake not yet answered ("" if unreadable)
        self._rounds: int | None = 0  # token round trips left; None: until the connection ends
        self._owed = 0  # tokens sent upstream, not yet answered
        self._to_upstream = 0  # client tokens not yet reported on the upstream side
        self._to_client = 0  # broker tokens not yet reported on the client side

    def handshake_sent(self, frame: bytearray) -> None:
        try:
            self._mechanism = sasl_mechanism(frame, parse_request_header(frame)) or _UNKNOWN
        except (ProtocolError, ValueError):
            self._mechanism = _UNKNOWN

    def handshake_answered(self, frame: bytearray) -> None:
        """Raw-token mode starts when the handshake's answer has error code 0."""
        mechanism, self._mechanism = self._mechanism, None
        if mechanism is None or len(frame) < 10 or int.from_bytes(frame[8:10], "big", signed=True) != 0:
            return
        self._rounds = SASL_V0_ROUNDS.get(mechanism.upper()) if mechanism else None

    def client_request(self) -> bool:
        """True if this client frame is a token."""
        if self._rounds is None or self._rounds > 0:
            self._owed += 1
            self._to_upstream += 1
            return True
        return False

    def upstream_request(self) -> bool:
        if self._to_upstream:
            self._to_upstream -= 1
            return True
        return False

    def upstream_response(self) -> bool:
        if self._owed or self._rounds is None:
            self._owed = max(self._owed - 1, 0)
            self._to_client += 1
            if self._rounds is not None:
                self._rounds -= 1
            return True
        return False

    def client_response(self) -> bool:
        if self._to_client:
            self._to_client -= 1
            return True
        return False
