"""Big frame buffers reused by the relay engine (corrfix.proxy._spares)."""

from __future__ import annotations

from corrfix.proxy._spares import SPARE_BYTES, FrameSpares
from protocol import BIG_FRAME


def test_a_frame_is_handed_out_again_only_once_nothing_else_holds_it():
    """One reference elsewhere is enough to keep a frame from being reused."""
    spares = FrameSpares()
    held = [bytearray(BIG_FRAME)]  # the core keeps a request until its answer: one reference
    spares.keep(held)
    assert spares.take(BIG_FRAME) is not held[0]
    view = memoryview(held.pop())[100:]  # a send backlog keeps a view of the unsent rest
    frame_id = id(view.obj)
    assert spares.take(BIG_FRAME) is not view.obj
    del view
    again = spares.take(BIG_FRAME)
    assert id(again) == frame_id and len(again) == BIG_FRAME
    assert spares.take(BIG_FRAME) is not again  # handed out once


def test_only_big_frames_of_the_asked_size_are_handed_out():
    spares = FrameSpares()
    spares.keep([bytearray(100), bytearray(BIG_FRAME + 1)])
    big_id = id(spares._frames[0])
    assert len(spares._frames) == 1  # the small frame is not kept
    assert id(spares.take(BIG_FRAME)) != big_id  # another size: a fresh buffer
    assert id(spares.take(BIG_FRAME + 1)) == big_id


def test_what_is_kept_stays_bounded_the_newest_is_reused_and_the_oldest_forgotten():
    spares = FrameSpares()
    size = SPARE_BYTES // 4
    frames = [bytearray([mark]) * size for mark in range(1, 7)]
    spares.keep(frames)
    del frames
    taken = [spares.take(size) for _ in range(6)]
    assert [t[0] for t in taken] == [6, 5, 4, 3, 0, 0]  # newest first; the two oldest were forgotten


def test_clear_forgets_everything():
    spares = FrameSpares()
    spares.keep([bytearray(b"\x01") * BIG_FRAME])  # marked, and free once the list is gone
    spares.clear()
    fresh = spares.take(BIG_FRAME)
    assert fresh == bytearray(BIG_FRAME)  # a new, zero-filled buffer, not the marked one
