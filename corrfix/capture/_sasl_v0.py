"""Which frames a capture sees are SASL v0 tokens, on both sides of the proxy.

After a successful SaslHandshake v0, the client and broker exchange authentication tokens
as bare size-prefixed frames with no Kafka header, which the proxy passes through. The
capture must not read their first bytes as api key and correlation id, and must not store
them: they carry credentials. Which frames they are is protocol's rule
(:class:`protocol.SaslV0Tokens`), the one the repair machine follows; this adds only that
each token is seen twice, once on each side of the proxy.
"""

from __future__ import annotations

from protocol import BytesLike, SaslV0Tokens


class SaslTokens:
    """One connection's SASL v0 state; created when a SaslHandshake v0 goes by."""

    __slots__ = ("_exchange", "_to_client", "_to_upstream")

    def __init__(self) -> None:
        self._exchange = SaslV0Tokens()
        self._to_upstream = 0  # client tokens not yet seen on the upstream side
        self._to_client = 0  # broker tokens not yet seen on the client side

    def handshake_sent(self, frame: BytesLike) -> None:
        self._exchange.handshake_sent(frame)

    def handshake_answered(self, frame: BytesLike) -> None:
        self._exchange.handshake_answered(frame)

    def client_request(self) -> bool:
        """True if this client frame is a token."""
        if self._exchange.request_is_token():
            self._to_upstream += 1
            return True
        return False

    def upstream_request(self) -> bool:
        if self._to_upstream:
            self._to_upstream -= 1
            return True
        return False

    def upstream_response(self) -> bool:
        if self._exchange.answer_is_token():
            self._to_client += 1
            return True
        return False

    def client_response(self) -> bool:
        if self._to_client:
            self._to_client -= 1
            return True
        return False
