"""The SASL rules a relay must follow, written once for the proxy, the chaos relay and capture."""

from __future__ import annotations

from protocol._api_key import ApiKey
from protocol._errors import ProtocolError
from protocol._framing import BytesLike
from protocol._headers import parse_request_header
from protocol._requests import sasl_mechanism

SASL_KEYS = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})
"""Until authentication completes, Kafka's SASL authenticator accepts only the next SASL
request and fails the connection on anything else."""

SASL_V0_ROUNDS = {"PLAIN": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2, "OAUTHBEARER": 1}
"""Raw-token round trips after a SaslHandshake v0, by mechanism. A mechanism not listed
(GSSAPI, anything custom) has no fixed count: a relay then cannot tell where the tokens end."""


def is_sasl_v0_handshake(api_key: int, api_version: int) -> bool:
    """After a successful SaslHandshake v0, SASL tokens travel as bare size-prefixed frames
    with no Kafka header and no correlation id (v1+ wraps them in SaslAuthenticate)."""
    return api_key == ApiKey.SASL_HANDSHAKE and api_version == 0


class SaslV0Tokens:
    """Which frames of one connection are SASL v0 tokens, from the frames alone.

    Feed it the SaslHandshake v0 request and its answer; then ask of each later client frame
    whether it is a token, and of each broker frame whether it answers one. A successful
    handshake starts ``SASL_V0_ROUNDS`` round trips of tokens (an unlisted mechanism: tokens
    until the connection ends). The repair machine, capture and the chaos relay all decide
    by this one rule.
    """

    __slots__ = ("_mechanism", "_owed", "_rounds", "active", "tokens_owed")

    def __init__(self) -> None:
        self._mechanism: str | None = None  # of a handshake not yet answered ("" if unreadable)
        self._rounds: int | None = 0  # token round trips left; None: until the connection ends
        self._owed = 0  # tokens sent, not answered yet
        self.active = False
        """True while client frames are tokens (an attribute: relays read it per frame)."""
        self.tokens_owed = False
        """True while a broker frame may answer a token: False means :meth:`answer_is_token`
        is False, so a relay reads this per frame instead of calling it."""

    def handshake_sent(self, frame: BytesLike) -> None:
        try:
            self._mechanism = sasl_mechanism(frame, parse_request_header(frame)) or ""
        except (ProtocolError, ValueError):
            self._mechanism = ""

    def handshake_answered(self, answer: BytesLike) -> None:
        """Tokens start when the handshake's answer has error code 0 (header v0: body at 8)."""
        mechanism, self._mechanism = self._mechanism, None
        if mechanism is None or len(answer) < 10 or int.from_bytes(answer[8:10], "big", signed=True) != 0:
            return
        self._rounds = SASL_V0_ROUNDS.get(mechanism.upper()) if mechanism else None
        self.active = self._rounds is None or self._rounds > 0
        self.tokens_owed = self._owed > 0 or self._rounds is None

    def request_is_token(self) -> bool:
        if self.active:
            self._owed += 1
            self.tokens_owed = True
            return True
        return False

    def answer_is_token(self) -> bool:
        if self._owed or self._rounds is None:
            self._owed = max(self._owed - 1, 0)
            if self._rounds is not None:
                self._rounds -= 1
                self.active = self._rounds > 0
            self.tokens_owed = self._owed > 0 or self._rounds is None
            return True
        return False
