"""The SASL rules a relay must follow, written once for the proxy, the chaos relay and capture."""

from __future__ import annotations

from protocol._api_key import ApiKey

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
