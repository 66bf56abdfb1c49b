"""Sans-IO Kafka wire layer: framing, headers and the few body fields the proxy reads.

No sockets, no trio, no clock. Bodies are encoded and decoded by kafka-python from Apache
Kafka's JSON schemas; only the hot-path fields are parsed by hand.
"""

from .api_key import ApiKey
from .errors import FrameSizeError, ProtocolError
from .framing import DEFAULT_MAX_FRAME_SIZE, SIZE_PREFIX, FrameDecoder, frame
from .headers import (
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
from .requests import (
    expects_response,
    fetch_max_wait_ms,
    produce_acks,
    produce_is_idempotent,
    sasl_mechanism,
)
from .sasl import SASL_KEYS, SASL_V0_ROUNDS, is_sasl_v0_handshake
from .schemas import api_name, api_schemas, is_flexible, request_class, response_class

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "SASL_KEYS",
    "SASL_V0_ROUNDS",
    "SIZE_PREFIX",
    "ApiKey",
    "FrameDecoder",
    "FrameSizeError",
    "ProtocolError",
    "RequestHeader",
    "api_name",
    "api_schemas",
    "expects_response",
    "fetch_max_wait_ms",
    "frame",
    "is_flexible",
    "is_sasl_v0_handshake",
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
    "sasl_mechanism",
]
