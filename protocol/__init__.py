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
from ._bodies import body_decodes_exactly, decode_body, encode_body
from ._errors import FrameSizeError, ProtocolError
from ._framing import (
    ADOPT_SHARE,
    BIG_FRAME,
    DEFAULT_MAX_FRAME_SIZE,
    SIZE_PREFIX,
    BytesLike,
    FrameDecoder,
    frame,
)
from ._headers import (
    CORRELATION_ID,
    MIN_RESPONSE_FRAME,
    REQUEST_CORRELATION_OFFSET,
    RESPONSE_CORRELATION_OFFSET,
    RequestFields,
    RequestHeader,
    RequestHeaderReader,
    parse_request_header,
    patch_request_correlation_id,
    patch_response_correlation_id,
    request_correlation_id,
    request_header_version,
    response_body_offset,
    response_correlation_id,
    response_header_version,
)
from ._plausible import HEADER_IMPLAUSIBLE, HEADER_NEEDS_MORE, MIN_REQUEST_SIZE, request_header_end
from ._produce_layout import (
    NO_PRODUCER_ID,
    PRODUCE_FIRST_FLEXIBLE,
    PRODUCE_FIRST_TOPIC_ID,
    PRODUCE_FIRST_TRANSACTIONAL_ID,
    RECORD_BATCH_HEADER,
    RECORD_BATCH_HEADER_SIZE,
    RECORD_BATCH_LOG_OVERHEAD,
    RECORD_BATCH_MAGIC_OFFSET,
)
from ._requests import (
    expects_response,
    fetch_max_wait_ms,
    join_group_rebalance_timeout_ms,
    produce_acks,
    produce_acks_at,
    produce_is_idempotent,
    sasl_mechanism,
)
from ._rewrite import needs_rewrite, rewrite_response
from ._sasl import SASL_KEYS, SASL_V0_ROUNDS, SaslV0Tokens, is_sasl_v0_handshake
from ._schemas import (
    ApiSchema,
    api_name,
    api_schemas,
    every_request_schema,
    is_flexible,
    request_class,
    response_class,
)
from ._varint import read_compact_string, read_tagged_fields, read_uvarint

__all__ = [
    "ADOPT_SHARE",
    "BIG_FRAME",
    "CORRELATION_ID",
    "DEFAULT_MAX_FRAME_SIZE",
    "HEADER_IMPLAUSIBLE",
    "HEADER_NEEDS_MORE",
    "MIN_REQUEST_SIZE",
    "MIN_RESPONSE_FRAME",
    "NO_PRODUCER_ID",
    "PRODUCE_FIRST_FLEXIBLE",
    "PRODUCE_FIRST_TOPIC_ID",
    "PRODUCE_FIRST_TRANSACTIONAL_ID",
    "RECORD_BATCH_HEADER",
    "RECORD_BATCH_HEADER_SIZE",
    "RECORD_BATCH_LOG_OVERHEAD",
    "RECORD_BATCH_MAGIC_OFFSET",
    "REQUEST_CORRELATION_OFFSET",
    "RESPONSE_CORRELATION_OFFSET",
    "SASL_KEYS",
    "SASL_V0_ROUNDS",
    "SIZE_PREFIX",
    "ApiKey",
    "ApiSchema",
    "BytesLike",
    "FrameDecoder",
    "FrameSizeError",
    "ProtocolError",
    "RequestFields",
    "RequestHeader",
    "RequestHeaderReader",
    "SaslV0Tokens",
    "api_name",
    "api_schemas",
    "body_decodes_exactly",
    "cap_api_versions",
    "client_software",
    "decodable_max_versions",
    "decode_body",
    "encode_body",
    "every_request_schema",
    "expects_response",
    "fetch_max_wait_ms",
    "frame",
    "is_flexible",
    "is_sasl_v0_handshake",
    "join_group_rebalance_timeout_ms",
    "mis_skips_tagged_fields",
    "needs_rewrite",
    "parse_request_header",
    "patch_request_correlation_id",
    "patch_response_correlation_id",
    "produce_acks",
    "produce_acks_at",
    "produce_is_idempotent",
    "read_compact_string",
    "read_tagged_fields",
    "read_uvarint",
    "request_class",
    "request_correlation_id",
    "request_header_end",
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
