"""The SASL v0 token rule (protocol.SaslV0Tokens), which the proxy, capture and chaos share."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.sasl import SaslHandshakeRequest, SaslHandshakeResponse

from protocol import SaslV0Tokens
from protocol.testing import encode_request, encode_response


def handshake(mechanism: str) -> bytes:
    return encode_request(SaslHandshakeRequest[0](mechanism=mechanism), correlation_id=1)


def answer(error_code: int) -> bytes:
    return encode_response(SaslHandshakeResponse[0](error_code=error_code, mechanisms=["PLAIN"]), 1)


def exchange(mechanism: str, error_code: int = 0) -> SaslV0Tokens:
    tokens = SaslV0Tokens()
    tokens.handshake_sent(handshake(mechanism))
    tokens.handshake_answered(answer(error_code))
    return tokens


@pytest.mark.parametrize(("mechanism", "rounds"), [("PLAIN", 1), ("SCRAM-SHA-256", 2), ("scram-sha-512", 2)])
def test_a_known_mechanism_has_its_rounds_of_tokens_then_requests_again(mechanism, rounds):
    tokens = exchange(mechanism)
    for _ in range(rounds):
        assert tokens.active
        assert tokens.request_is_token()
        assert tokens.answer_is_token()
    assert not tokens.active
    assert not tokens.request_is_token()
    assert not tokens.answer_is_token()


def test_an_unlisted_mechanism_has_tokens_until_the_connection_ends():
    tokens = exchange("GSSAPI")
    for _ in range(10):
        assert tokens.request_is_token() and tokens.answer_is_token()
    assert tokens.active


def test_a_failed_handshake_starts_no_tokens():
    tokens = exchange("PLAIN", error_code=33)
    assert not tokens.active and not tokens.request_is_token()


def test_no_handshake_no_tokens():
    tokens = SaslV0Tokens()
    assert not tokens.active
    tokens.handshake_answered(answer(0))  # an answer to no handshake changes nothing
    assert not tokens.request_is_token()


def test_pipelined_tokens_are_answered_in_order():
    tokens = exchange("SCRAM-SHA-256")
    assert tokens.request_is_token() and tokens.request_is_token()
    assert tokens.answer_is_token() and tokens.answer_is_token()
    assert not tokens.active


@settings(max_examples=300, deadline=None)
@given(
    mechanism=st.sampled_from(["PLAIN", "SCRAM-SHA-256", "GSSAPI", "OAUTHBEARER"]),
    error_code=st.sampled_from([0, 0, 33]),
    steps=st.lists(st.sampled_from(["request", "answer", "handshake"]), max_size=30),
)
def test_tokens_owed_says_whether_the_next_answer_is_a_token(mechanism, error_code, steps):
    """Relays read ``tokens_owed`` per broker frame instead of calling answer_is_token()."""
    tokens = SaslV0Tokens()
    for step in steps:
        if step == "handshake":
            tokens.handshake_sent(handshake(mechanism))
            tokens.handshake_answered(answer(error_code))
        elif step == "request":
            tokens.request_is_token()
        else:
            owed = tokens.tokens_owed
            assert tokens.answer_is_token() == owed
