"""What ``corrfix replay`` sends: each captured client connection's requests, in order.

Only client-side frame rows are used: on a proxy capture they carry the client's own ids
(what a client would send to any broker); on a wire import, every frame is client side.
Each request is paired with the response the capture holds for it (same connection, same
client correlation id, the first unanswered request with that id), for the latency and
error codes the replay is compared with.
"""

from __future__ import annotations

import collections
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.compute as pc

from corrfix.capture import read_capture
from corrfix.replay._topic_ids import NAMING_ANSWERS
from protocol import ProtocolError, expects_response, parse_request_header

_COLUMNS = [
    "capture_id",
    "connection_id",
    "seq",
    "direction",
    "wall_ns",
    "api_key",
    "api_version",
    "client_correlation_id",
    "frame_length",
    "frame",
]


@dataclass(slots=True)
class PlannedRequest:
    """One captured request and, if the capture has it, its response."""

    index: int
    connection_id: str
    seq: int
    wall_ns: int
    frame: bytes
    frame_length: int
    api_key: int | None
    api_version: int | None
    correlation_id: int | None
    expects_response: bool
    captured_response: bytes | None = None
    captured_response_length: int | None = None
    captured_response_ns: int | None = None

    @property
    def truncated(self) -> bool:
        """Not captured whole (snap length, or a gap in a wire capture): cannot be re-sent."""
        return len(self.frame) < self.frame_length

    @property
    def captured_latency_ns(self) -> int | None:
        if self.captured_response_ns is None:
            return None
        return self.captured_response_ns - self.wall_ns


@dataclass(slots=True)
class PlannedConnection:
    connection_id: str
    requests: list[PlannedRequest] = field(default_factory=list)


@dataclass(slots=True)
class ReplayPlan:
    connections: list[PlannedConnection]
    # Captured answers (frame, api key, version) that may pair topic names with topic ids,
    # from every connection of the capture, replayed or not.
    naming_answers: list[tuple[bytes, int, int]] = field(default_factory=list)

    @property
    def requests(self) -> list[PlannedRequest]:
        return [r for conn in self.connections for r in conn.requests]

    @property
    def first_ns(self) -> int:
        """Capture time of the earliest request: the replay's time zero."""
        return min((r.wall_ns for r in self.requests), default=0)


def load_plan(path: Path, connections: Collection[str] | None = None) -> ReplayPlan:
    """The replay plan of a capture directory (or file); ``connections`` limits it to those ids."""
    table = read_capture(path)
    mask = pc.and_(pc.equal(table["kind"], "frame"), pc.equal(table["side"], "client"))
    rows = table.filter(mask).select(_COLUMNS).to_pylist()
    capture_ids = {row["capture_id"] for row in rows}
    by_connection: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    for row in rows:
        by_connection[(row["capture_id"], row["connection_id"])].append(row)
    planned: list[PlannedConnection] = []
    naming: list[tuple[bytes, int, int]] = []
    index = 0
    for (capture_id, connection_id), conn_rows in by_connection.items():
        naming += [
            (row["frame"], row["api_key"], row["api_version"])
            for row in conn_rows
            if row["direction"] == "response"
            and row["api_key"] in NAMING_ANSWERS
            and row["frame"] is not None
        ]
        if connections is not None and connection_id not in connections:
            continue
        name = connection_id if len(capture_ids) == 1 else f"{capture_id}/{connection_id}"
        conn = PlannedConnection(name)
        waiting: dict[int, collections.deque[PlannedRequest]] = collections.defaultdict(collections.deque)
        for row in sorted(conn_rows, key=lambda r: r["seq"]):
            if row["direction"] == "request":
                request = _request(index, name, row)
                index += 1
                conn.requests.append(request)
                if request.correlation_id is not None:
                    waiting[request.correlation_id].append(request)
            elif row["direction"] == "response" and waiting.get(row["client_correlation_id"]):
                request = waiting[row["client_correlation_id"]].popleft()
                request.captured_response = row["frame"]
                request.captured_response_length = row["frame_length"]
                request.captured_response_ns = row["wall_ns"]
        if conn.requests:
            planned.append(conn)
    planned.sort(key=lambda c: c.requests[0].wall_ns)
    return ReplayPlan(planned, naming)


def _request(index: int, connection_id: str, row: dict) -> PlannedRequest:
    frame: bytes = row["frame"] or b""
    api_key, api_version, correlation_id = row["api_key"], row["api_version"], row["client_correlation_id"]
    expects = True
    try:
        header = parse_request_header(frame)
        api_key, api_version, correlation_id = header.api_key, header.api_version, header.correlation_id
        expects = expects_response(frame, header)
    except ProtocolError:
        pass  # truncated: it will not be sent anyway
    return PlannedRequest(
        index=index,
        connection_id=connection_id,
        seq=row["seq"],
        wall_ns=row["wall_ns"],
        frame=frame,
        frame_length=row["frame_length"] if row["frame_length"] is not None else len(frame),
        api_key=api_key,
        api_version=api_version,
        correlation_id=correlation_id,
        expects_response=expects,
    )
