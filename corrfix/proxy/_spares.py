"""Big frame buffers the engine has finished with, handed out again instead of fresh ones.

A big frame is received into a buffer of its own (``FrameDecoder.receive_target``); a fresh
``bytearray`` of a MiB is zero-filled first, which costs about half of the copy the own
buffer saves. Every big frame the engine writes is remembered here, and once nothing else
holds it (the core has its answer, the socket took all of it, capture is done with it), it
is the next guessed buffer of its size. It is used under the engine's lock (or in trio's
thread, when the engine runs as a task).
"""

from __future__ import annotations

import sys

from protocol import BIG_FRAME

SPARE_BYTES = 16 * 1024 * 1024
"""At most this much of remembered frames, free or not, per engine: what an idle engine can
keep after a burst of big frames, until its last connection ends."""

_FREE = 0
"""``sys.getrefcount`` of a remembered buffer that nothing else holds, as :meth:`FrameSpares.take`
sees it; set once by :func:`_calibrate`. 0 never matches: no buffer is reused."""


class FrameSpares:
    """Big frames written by the engine, reused once nothing else refers to them; the oldest
    are forgotten first."""

    __slots__ = ("_bytes", "_frames")

    def __init__(self) -> None:
        self._frames: list[bytearray] = []
        self._bytes = 0

    def keep(self, frames: list[bytearray]) -> None:
        """Remember the big ones among frames just written (or queued) to a socket."""
        kept = self._frames
        for frame in frames:
            size = len(frame)
            if size >= BIG_FRAME and type(frame) is bytearray:
                kept.append(frame)
                self._bytes += size
        while self._bytes > SPARE_BYTES:
            self._bytes -= len(kept.pop(0))

    def take(self, size: int) -> bytearray:
        """A buffer of ``size`` bytes, its content undefined: a remembered one nothing else
        holds, the most recent first (the likeliest still in the CPU's cache), or a fresh one.
        Whoever fills it must overwrite every byte it exposes."""
        kept = self._frames
        for index in range(len(kept) - 1, -1, -1):  # not enumerate(): its tuple holds a reference
            spare = kept[index]
            if len(spare) == size and sys.getrefcount(spare) <= _FREE:
                del kept[index]
                self._bytes -= size
                return spare
        return bytearray(size)

    def clear(self) -> None:
        self._frames.clear()
        self._bytes = 0


def _calibrate() -> int:
    """The count ``take`` sees for a buffer only its list holds, found by running ``take``: the
    list, the loop's name and the call's argument each count on CPython 3.11-3.13, but a
    borrowed local does not count on every version. A count is kept only if it tells a free
    buffer from one held once elsewhere; if none does, buffers are not reused (0)."""
    global _FREE  # set once, at import, before any engine exists
    for candidate in range(1, 8):
        _FREE = candidate
        spares = FrameSpares()
        held = [bytearray(BIG_FRAME)]
        spares.keep(held)
        if spares.take(BIG_FRAME) is held[0]:
            continue  # one holder besides the list, and handed out: too high
        free_id = id(held[0])
        held.clear()  # now only the list holds it, so it is alive and its id is its own
        if id(spares.take(BIG_FRAME)) == free_id:
            return candidate
    return 0


_FREE = _calibrate()
