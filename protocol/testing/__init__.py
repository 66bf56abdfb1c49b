"""Test tooling for the wire layer: frame builders and fuzz targets, for tests and the bench.

Nothing in the product imports this package; it exists so that the bench need not import
the test suite.
"""

from __future__ import annotations

from protocol._encoding import encode_response

from ._frames import encode_request, encode_uvarint, request_frame, response_frame
from ._fuzz import (
    BAD_VARINTS,
    MUTATIONS,
    STREAM_MAX_FRAME,
    Seed,
    mutate,
    one_case,
    random_message,
    random_stream,
    request_seeds,
    request_target,
    response_seeds,
    response_target,
    stream_target,
    varint_target,
)

__all__ = [
    "BAD_VARINTS",
    "MUTATIONS",
    "STREAM_MAX_FRAME",
    "Seed",
    "encode_request",
    "encode_response",
    "encode_uvarint",
    "mutate",
    "one_case",
    "random_message",
    "random_stream",
    "request_frame",
    "request_seeds",
    "request_target",
    "response_frame",
    "response_seeds",
    "response_target",
    "stream_target",
    "varint_target",
]
