"""``--capture-max-bytes``: which capture files go, and which never do."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from corrfix.capture import _retention as retention
from corrfix.capture._retention import hold, lock_path, prune, release
from corrfix.capture.format import SUMMARY_FORMAT

OLD, RUNNING = "capture-20261101T000000.000000Z-aaaaaaaa", "capture-20261102T000000.000000Z-bbbbbbbb"


def make(directory: Path, stem: str, numbers: range, size: int = 100) -> list[str]:
    names = [f"{stem}-{n:06d}.arrows" for n in numbers]
    for name in names:
        (directory / name).write_bytes(b"x" * size)
    return names


def summary(directory: Path, stem: str, *, finished: bool) -> Path:
    path = directory / f"{stem}.capture.json"
    path.write_text(json.dumps({"format": SUMMARY_FORMAT, "finished": finished}))
    return path


def left(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_under_the_limit_nothing_goes(tmp_path):
    make(tmp_path, RUNNING, range(1, 4))
    assert prune(tmp_path, 300).files == ()
    assert len(left(tmp_path)) == 3


def test_the_oldest_go_first_older_captures_before_the_running_one(tmp_path):
    old = make(tmp_path, OLD, range(1, 3))
    old_summary = summary(tmp_path, OLD, finished=True)
    running = make(tmp_path, RUNNING, range(1, 4))
    removed = prune(tmp_path, 250)
    assert removed.files == (*old, running[0]) and removed.bytes == 300
    assert left(tmp_path) == running[1:]
    assert not old_summary.exists()  # a finished capture's summary goes with its last file


def test_a_capture_s_newest_file_stays_unless_it_finished(tmp_path):
    """The newest file of a capture that has not finished may be the one another process is
    writing (a ``--workers`` sibling, or this writer): removing it frees nothing."""
    crashed = make(tmp_path, OLD, range(1, 3))
    summary(tmp_path, OLD, finished=False)
    running = make(tmp_path, RUNNING, range(1, 3))
    removed = prune(tmp_path, 0)
    assert removed.files == (crashed[0], running[0])
    assert left(tmp_path) == sorted([crashed[1], f"{OLD}.capture.json", running[1]])


def test_the_newest_file_of_a_capture_whose_writer_died_goes_too(tmp_path):
    """A proxy killed or crashed never says its capture finished: each such stop left its
    newest file for good, up to --capture-rotate-bytes each, beyond the limit. Its lock file
    is there but nobody holds it (the kernel let go), so its writer is known to be gone."""
    dead = make(tmp_path, OLD, range(1, 3))
    summary(tmp_path, OLD, finished=False)
    release_later = hold(tmp_path, OLD)
    running = make(tmp_path, RUNNING, range(1, 3))
    alive = hold(tmp_path, RUNNING)
    try:
        assert prune(tmp_path, 0).files == (dead[0], running[0])  # both writers hold their locks
        os.close(release_later)  # as the kernel does when the process dies
        removed = prune(tmp_path, 0)
        assert removed.files == (dead[1],)
        assert not (tmp_path / f"{OLD}.capture.json").exists() and not lock_path(tmp_path, OLD).exists()
        assert left(tmp_path) == [f".{RUNNING}.lock", running[1]]
    finally:
        release(tmp_path, RUNNING, alive)
    assert left(tmp_path) == [running[1]]


def test_other_files_are_never_touched(tmp_path):
    others = ["notes.arrows", ".capture-x-000001.arrows.partial", "capture-x.capture.json.tmp", "out.pcapng"]
    for name in others:
        (tmp_path / name).write_bytes(b"y" * 1000)
    (tmp_path / "sub").mkdir()
    make(tmp_path / "sub", OLD, range(1, 3))
    summary(tmp_path / "sub", OLD, finished=True)
    assert prune(tmp_path, 0).files == ()
    assert len(left(tmp_path / "sub")) == 3 and set(others) <= set(left(tmp_path))


def test_a_finished_capture_s_summary_goes_when_another_writer_took_some_of_its_files(tmp_path, monkeypatch):
    """Two ``--workers`` writers pruning at once: the other took the finished capture's first
    file between this one's listing and its removing. The capture's files are all gone, so its
    summary goes too, not left behind for ever naming files that are not there."""
    old = make(tmp_path, OLD, range(1, 3))
    old_summary = summary(tmp_path, OLD, finished=True)
    running = make(tmp_path, RUNNING, range(1, 3))
    finished = retention._finished

    def the_other_writer_prunes_meanwhile(path: Path) -> bool:
        (tmp_path / old[0]).unlink(missing_ok=True)
        return finished(path)

    monkeypatch.setattr(retention, "_finished", the_other_writer_prunes_meanwhile)
    removed = prune(tmp_path, 200)
    assert removed.files == (old[1],) and removed.bytes == 100
    assert left(tmp_path) == running
    assert not old_summary.exists()


EMPTY_1, EMPTY_2 = "capture-20261031T000000.000000Z-11111111", "capture-20261031T010000.000000Z-22222222"
LATER, NEWEST = "capture-20261103T000000.000000Z-cccccccc", "capture-20261104T000000.000000Z-dddddddd"


def test_captures_over_with_no_file_older_than_every_file_leave_no_summary_or_lock(tmp_path):
    """A proxy restarted again and again with no traffic (a crash loop, rolling restarts)
    left a summary and a lock file at each start, per worker, for ever; with the directory
    under the limit, nothing was ever pruned."""
    summary(tmp_path, EMPTY_1, finished=True)
    summary(tmp_path, EMPTY_2, finished=False)
    os.close(hold(tmp_path, EMPTY_2))  # its writer died: the lock file is there, nobody holds it
    running = make(tmp_path, RUNNING, range(1, 2))
    summary(tmp_path, RUNNING, finished=False)
    summary(tmp_path, LATER, finished=True)  # newer than the oldest file: over all the same
    assert prune(tmp_path, 10_000).files == ()
    assert left(tmp_path) == sorted([*running, f"{RUNNING}.capture.json"])


def test_restarts_with_no_traffic_leave_no_trail_after_a_run_that_left_files(tmp_path):
    """The usual crash loop or rolling restart follows a run that had traffic: its files stay
    while the directory is under the limit, and every later start is newer than them. Each
    such start left a summary and a lock file, per worker, for ever."""
    earlier = make(tmp_path, OLD, range(1, 3))
    summary(tmp_path, OLD, finished=True)
    summary(tmp_path, RUNNING, finished=True)  # started and stopped with no traffic
    summary(tmp_path, LATER, finished=False)
    os.close(hold(tmp_path, LATER))  # crashed: the lock file is there, nobody holds it
    alive = hold(tmp_path, NEWEST)
    try:
        summary(tmp_path, NEWEST, finished=False)  # running, no traffic yet
        assert prune(tmp_path, 10_000).files == ()
        assert left(tmp_path) == sorted(
            [*earlier, f"{OLD}.capture.json", f".{NEWEST}.lock", f"{NEWEST}.capture.json"]
        )
    finally:
        release(tmp_path, NEWEST, alive)


def test_a_capture_that_wrote_its_first_file_before_it_died_keeps_its_summary(tmp_path, monkeypatch):
    """A ``--workers`` sibling with no file when this writer listed the directory wrote its
    first file and died before this writer asked whether it is over. Its summary and lock file
    stay with that file, or the file would pass for an import's and be kept for ever."""
    summary(tmp_path, RUNNING, finished=False)
    os.close(hold(tmp_path, RUNNING))
    abandoned = retention._abandoned

    def first_file_then_crash(directory: Path, stem: str) -> bool:
        make(directory, stem, range(1, 2))
        return abandoned(directory, stem)

    monkeypatch.setattr(retention, "_abandoned", first_file_then_crash)
    assert prune(tmp_path, 10_000).files == ()
    assert left(tmp_path) == sorted(
        [f".{RUNNING}.lock", f"{RUNNING}-000001.arrows", f"{RUNNING}.capture.json"]
    )


def test_with_no_file_at_all_only_a_running_capture_s_summary_stays(tmp_path):
    summary(tmp_path, EMPTY_1, finished=True)
    summary(tmp_path, OLD, finished=False)
    alive = hold(tmp_path, OLD)
    try:
        summary(tmp_path, RUNNING, finished=False)  # no lock file: an older writer that may run
        assert prune(tmp_path, 0).files == ()
        assert left(tmp_path) == sorted([f".{OLD}.lock", f"{OLD}.capture.json", f"{RUNNING}.capture.json"])
    finally:
        release(tmp_path, OLD, alive)


def test_a_missing_directory_is_nothing_to_prune(tmp_path):
    assert prune(tmp_path / "gone", 0).files == ()


@settings(max_examples=60, deadline=None)
@given(
    captures=st.lists(
        st.tuples(
            st.lists(st.integers(1, 500), min_size=1, max_size=5), st.sampled_from([None, False, True])
        ),
        min_size=1,
        max_size=4,
    ),
    limit=st.integers(0, 3000),
)
def test_pruning_keeps_within_the_limit_whatever_it_may_and_removes_oldest_first(
    tmp_path_factory, captures, limit
):
    directory = tmp_path_factory.mktemp("ring")
    protected, order = set(), []
    for index, (sizes, finished) in enumerate(captures):
        stem = f"capture-2026110{index}T000000.000000Z-{index:08x}"
        for number, size in enumerate(sizes, 1):
            name = f"{stem}-{number:06d}.arrows"
            (directory / name).write_bytes(b"z" * size)
            order.append((name, size))
        if finished is not None:
            summary(directory, stem, finished=finished)
        if finished is not True:
            protected.add(f"{stem}-{len(sizes):06d}.arrows")
    removed = prune(directory, limit)
    remaining = [(name, size) for name, size in order if (directory / name).exists()]
    assert protected <= {name for name, _ in remaining}
    assert sum(size for _, size in remaining) <= limit or all(name in protected for name, _ in remaining)
    # Oldest first, and no more than needed: the removable files in name order, up to the first
    # that brings the total within the limit.
    removable = [name for name, _ in order if name not in protected]
    assert list(removed.files) == removable[: len(removed.files)]
    sizes = dict(order)
    if removed.files:
        total = sum(sizes.values())
        assert total - sum(sizes[name] for name in removed.files[:-1]) > limit
    assert removed.bytes == sum(size for name, size in order if name in removed.files)
