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
    """A frame's size prefix is negative or above the configured maximum."""

    def __init__(self, size: int, max_size: int, *, peer: str | None = None) -> None:
        self.size = size
        self.max_size = max_size
        problem = "negative" if size < 0 else f"larger than the maximum {max_size}"
        super().__init__(f"frame size {size} is {problem}", peer=peer)
