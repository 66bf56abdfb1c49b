"""Sans-IO Kafka wire layer: framing, headers and the few body fields the proxy reads.

No sockets, no trio, no clock, and nothing else of ours: every other layer builds on this one.
:mod:`protocol.testing` holds the frame builders and fuzz targets that only tests and the
bench use. Bodies are encoded and decoded by kafka-python from Apache
Kafka's JSON schemas; only the hot-path fields are parsed by hand.
"""

from ._api_key import ApiKey
from ._api_versions import (
    cap_api_versions,
    client_software,
    decodable_max_versions,
    mis_skips_tagged_fields,
    strip_tagged_fields,
    unsupported_api_versions_response,
)
from ._errors import FrameSizeError, ProtocolError
from ._framing import DEFAULT_MAX_FRAME_SIZE, SIZE_PREFIX, BytesLike, FrameDecoder, frame
from ._headers import (
    MIN_RESPONSE_FRAME,
    RequestHeader,
    parse_request_header,
    patch_request_correlation_id,
    patch_response_correlation_id,
    request_correlation_id,
    request_header_version,
    response_body_offset,
    response_correlation_id,
    response_header_version,
)
from ._requests import (
    expects_response,
    fetch_max_wait_ms,
    produce_acks,
    produce_is_idempotent,
    sasl_mechanism,
)
from ._rewrite import needs_rewrite, rewrite_response
from ._sasl import SASL_KEYS, SASL_V0_ROUNDS, SaslV0Tokens, is_sasl_v0_handshake
from ._schemas import api_name, api_schemas, is_flexible, request_class, response_class

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "MIN_RESPONSE_FRAME",
    "SASL_KEYS",
    "SASL_V0_ROUNDS",
    "SIZE_PREFIX",
    "ApiKey",
    "BytesLike",
    "FrameDecoder",
    "FrameSizeError",
    "ProtocolError",
    "RequestHeader",
    "SaslV0Tokens",
    "api_name",
    "api_schemas",
    "cap_api_versions",
    "client_software",
    "decodable_max_versions",
    "expects_response",
    "fetch_max_wait_ms",
    "frame",
    "is_flexible",
    "is_sasl_v0_handshake",
    "mis_skips_tagged_fields",
    "needs_rewrite",
    "parse_request_header",
    "patch_request_correlation_id",
    "patch_response_correlation_id",
    "produce_acks",
    "produce_is_idempotent",
    "request_class",
    "request_correlation_id",
    "request_header_version",
    "response_body_offset",
    "response_class",
    "response_correlation_id",
    "response_header_version",
    "rewrite_response",
    "sasl_mechanism",
    "strip_tagged_fields",
    "unsupported_api_versions_response",
]
