"""Message bodies decoded by kafka-python to exactly their length, or not at all.

kafka-python's public ``decode`` drops the end position and does not bounds-check string
lengths, so a truncated or padded body can decode "successfully". Here the same compiled
decoder that ``ApiMessage.decode`` uses is called, its end position kept, and a body counts
as decoded only when its fields end exactly where the frame says it ends. The address
rewriter relies on that before it re-encodes an answer; the wire-capture importer relies on
it to tell a real frame from bytes that merely look like a header.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from protocol._api_key import ApiKey
from protocol._errors import ProtocolError
from protocol._framing import BytesLike
from protocol._schemas import api_name, request_class, response_class

if TYPE_CHECKING:  # kafka-python loads only when a body is decoded or encoded
    from kafka.protocol.api_message import ApiMessage

_API_VERSIONS = ApiKey.API_VERSIONS


def decode_exactly(cls: type[ApiMessage], api_version: int, body: BytesLike) -> ApiMessage:
    """Decode ``body`` as ``cls`` at ``api_version``; :class:`ProtocolError` unless it is consumed exactly.

    The caller checks that ``api_version`` is within ``cls``'s versions.
    """
    flexible = cls.flexible_version_q(api_version)
    decode = cls._struct.compiled_decode_from(api_version, compact=flexible, tagged=flexible, data_class=cls)
    view = memoryview(body)
    what = f"{api_name(cls.API_KEY)} v{api_version} {cls.type} body"
    try:
        message, end = decode(view, 0)
    except Exception as exc:  # struct.error, IndexError, UnicodeDecodeError, AssertionError, ...
        raise ProtocolError(f"malformed {what}: {type(exc).__name__}: {exc}") from exc
    if end != len(view):
        raise ProtocolError(f"{what} is {len(view)} bytes but its fields end at {end}")
    return message


def decode_body(api_key: int, api_version: int, body: BytesLike, *, request: bool) -> ApiMessage:
    """A request (or response) body decoded exactly; :class:`ProtocolError` if it cannot be."""
    cls = request_class(api_key) if request else response_class(api_key)
    if cls is None or not 0 <= api_version <= cls.max_version:
        kind = "request" if request else "response"
        raise ProtocolError(f"kafka-python cannot decode {api_name(api_key)} v{api_version} {kind}s")
    return decode_exactly(cls, api_version, body)


def encode_body(message: ApiMessage) -> bytes:
    """Encode a decoded body again at its own version.

    A decoded message's header slot is unset, and kafka-python 3.0's version setter reads
    it: ``encode()`` with a version (which some api classes pass themselves, DeleteTopics
    for one) would raise AttributeError. The slot is set empty first.
    """
    try:
        message._header  # noqa: B018 - set or not?
    except AttributeError:
        message._header = None
    return bytes(message.encode())


def body_decodes_exactly(api_key: int, api_version: int, body: BytesLike, *, request: bool) -> bool | None:
    """Whether a request (or response) body decodes to exactly its length.

    None when kafka-python has no class for the api or does not know the version: the body
    can then be neither proven nor disproven. An ApiVersions answer may also be at v0
    whatever was asked (the broker's answer to a version it does not support).
    """
    cls = request_class(api_key) if request else response_class(api_key)
    if cls is None or not 0 <= api_version <= cls.max_version:
        return None
    versions = [api_version]
    if api_key == _API_VERSIONS and not request and api_version:
        versions.append(0)
    for version in versions:
        try:
            decode_exactly(cls, version, body)
        except ProtocolError:
            continue
        return True
    return False
