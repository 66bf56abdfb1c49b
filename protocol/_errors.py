"""Errors raised by the wire layer.

Everything malformed a peer can send surfaces as a :class:`ProtocolError`, so the I/O
shell needs exactly one ``except`` to log the problem and close that one connection.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """The peer sent bytes that are not a valid Kafka frame or header."""

    def __init__(self, message: str, *, peer: str | None = None) -> None:
        self.peer = peer
        super().__init__(f"{message} (peer {peer})" if peer else message)


class FrameSizeError(ProtocolError):
    """A frame's size prefix is negative or above the configured maximum.

    ``frames`` are the whole frames the same call cut before it, in order: they arrived
    intact, so a caller may still act on them before it closes the connection, as it would
    have had the bad prefix come in a later read."""

    def __init__(
        self, size: int, max_size: int, *, peer: str | None = None, frames: list[bytearray] | None = None
    ) -> None:
        self.size = size
        self.max_size = max_size
        self.frames: list[bytearray] = frames if frames is not None else []
        problem = "negative" if size < 0 else f"larger than the maximum {max_size}"
        super().__init__(f"frame size {size} is {problem}", peer=peer)
