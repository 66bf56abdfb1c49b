"""``corrfix capture info``: what a capture holds, without reading it by hand.

Connections with their addresses and close reasons, the time span, frames per api key on
each side and direction, repair events by kind, and the rows the capture lost (from the
JSON sidecars). Batches are aggregated one at a time, so memory stays at one batch.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from corrfix.capture._summary import read_summaries
from corrfix.capture.format import (
    CAPTURE_ID_KEY,
    SOURCE_KEY,
    VERSION_KEY,
    RowKind,
    capture_files,
    iter_batches,
)
from protocol import api_name

_META_COLUMNS = ["connection_id", "kind", "wall_ns", "client_address", "upstream_address", "reason"]


def _connection(connections: dict[tuple[str, str], dict[str, Any]], capture_id: str, conn: str) -> dict:
    key = (capture_id, conn)
    if key not in connections:
        connections[key] = {
            "capture_id": capture_id,
            "connection_id": conn,
            "client_address": None,
            "upstream_address": None,
            "opened_wall_ns": None,
            "closed_wall_ns": None,
            "close_reason": None,
            "frames": 0,
            "repairs": 0,
        }
    return connections[key]


def capture_info(path: Path) -> dict[str, Any]:
    """Totals of a capture directory (or file) as plain data (JSON-serialisable)."""
    files = capture_files(path)
    captures: dict[str, dict[str, Any]] = {}
    connections: dict[tuple[str, str], dict[str, Any]] = {}
    frames: Counter[tuple[str | None, str | None, int | None]] = Counter()
    frame_bytes: Counter[tuple[str | None, str | None, int | None]] = Counter()
    repairs: Counter[str] = Counter()
    first = last = None
    rows = 0
    for batch in iter_batches(path):
        metadata = batch.schema.metadata or {}
        capture_id = metadata.get(CAPTURE_ID_KEY, b"").decode()
        capture = captures.setdefault(
            capture_id,
            {
                "capture_id": capture_id,
                "source": metadata.get(SOURCE_KEY, b"").decode() or None,
                "schema_version": int(metadata.get(VERSION_KEY, b"0")),
                "rows": 0,
                "rows_lost": None,
                "finished": None,
                "files_removed": None,
            },
        )
        capture["rows"] += batch.num_rows
        rows += batch.num_rows
        if batch.num_rows == 0:
            continue
        low, high = pc.min_max(batch.column("wall_ns")).values()
        first = low.as_py() if first is None else min(first, low.as_py())
        last = high.as_py() if last is None else max(last, high.as_py())
        table = pa.Table.from_batches([batch.drop_columns(["frame"])])
        _count_frames(table, frames, frame_bytes)
        _count_per_connection(table, capture_id, connections, repairs)
        not_frames = table.filter(pc.not_equal(table.column("kind"), RowKind.FRAME.value))
        for row in not_frames.select(_META_COLUMNS).to_pylist():
            conn = _connection(connections, capture_id, row["connection_id"])
            if row["kind"] == RowKind.OPEN:
                conn["client_address"] = row["client_address"]
                conn["upstream_address"] = row["upstream_address"]
                conn["opened_wall_ns"] = row["wall_ns"]
            elif row["kind"] == RowKind.CLOSE:
                conn["closed_wall_ns"] = row["wall_ns"]
                conn["close_reason"] = row["reason"]
    lost_total = None
    for summary in read_summaries(path):
        summarised = captures.get(summary.capture_id)
        if summarised is None:
            continue  # a summary of a capture whose files are not here (or have no rows yet)
        summarised["rows_lost"] = summary.rows_lost
        summarised["finished"] = summary.finished
        summarised["files_removed"] = summary.files_removed
        lost_total = (lost_total or 0) + summary.rows_lost
    return {
        "path": str(path),
        "files": len(files),
        "file_bytes": sum(f.stat().st_size for f in files),
        "rows": rows,
        "captures": list(captures.values()),
        "first_wall_ns": first,
        "last_wall_ns": last,
        "duration_seconds": None if first is None or last is None else (last - first) / 1e9,
        "rows_lost": lost_total,
        "connections": sorted(connections.values(), key=_opened_order),
        "frames": [
            {
                "side": side,
                "direction": direction,
                "api_key": api_key,
                "api": None if api_key is None else api_name(api_key),
                "frames": count,
                "bytes": frame_bytes[(side, direction, api_key)],
            }
            for (side, direction, api_key), count in sorted(frames.items(), key=_frame_order)
        ],
        "repairs": dict(sorted(repairs.items())),
    }


def _opened_order(conn: dict[str, Any]) -> tuple[int, str, str]:
    opened = conn["opened_wall_ns"]
    return (opened if opened is not None else 0, conn["capture_id"], conn["connection_id"])


def _frame_order(item: tuple[tuple[str | None, str | None, int | None], int]) -> tuple[str, str, int]:
    (side, direction, api_key), _ = item
    return (side or "", direction or "", -1 if api_key is None else api_key)


def _count_frames(table: pa.Table, frames: Counter, frame_bytes: Counter) -> None:
    only = table.filter(pc.equal(table.column("kind"), RowKind.FRAME.value))
    if only.num_rows == 0:
        return
    grouped = only.group_by(["side", "direction", "api_key"], use_threads=False).aggregate(
        [([], "count_all"), ("frame_length", "sum")]
    )
    for row in grouped.to_pylist():
        key = (row["side"], row["direction"], row["api_key"])
        frames[key] += row["count_all"]
        frame_bytes[key] += row["frame_length_sum"] or 0


def _count_per_connection(
    table: pa.Table, capture_id: str, connections: dict[tuple[str, str], dict[str, Any]], repairs: Counter
) -> None:
    grouped = table.group_by(["connection_id", "kind", "event"], use_threads=False).aggregate(
        [([], "count_all")]
    )
    for row in grouped.to_pylist():
        kind = row["kind"]
        if kind not in (RowKind.FRAME, RowKind.REPAIR):
            continue
        conn = _connection(connections, capture_id, row["connection_id"])
        if kind == RowKind.FRAME:
            conn["frames"] += row["count_all"]
        else:
            conn["repairs"] += row["count_all"]
            repairs[row["event"] or "unknown"] += row["count_all"]


# -- text ------------------------------------------------------------------------------


def _time(wall_ns: int | None) -> str:
    if wall_ns is None:
        return "-"
    return (
        datetime.fromtimestamp(wall_ns / 1e9, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return [
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in [header, *rows]
    ]


def render_info(info: dict[str, Any], max_connections: int = 50) -> str:
    """The report ``corrfix capture info`` prints."""
    lines = [
        f"capture {info['path']}: {info['files']} files, {info['file_bytes']:,} bytes, {info['rows']:,} rows"
    ]
    for capture in info["captures"]:
        lost = "unknown" if capture["rows_lost"] is None else f"{capture['rows_lost']:,}"
        state = {True: "finished", False: "not finished (still running, or stopped uncleanly)"}.get(
            capture["finished"], "no summary"
        )
        removed = capture.get("files_removed")
        ring = f", removed {removed:,} older files (--capture-max-bytes)" if removed else ""
        lines.append(
            f"  capture {capture['capture_id']} ({capture['source']}, schema v{capture['schema_version']}): "
            f"{capture['rows']:,} rows, {lost} rows lost, {state}{ring}"
        )
    span = info["duration_seconds"]
    lines.append(
        f"time span: {_time(info['first_wall_ns'])} .. {_time(info['last_wall_ns'])}"
        + ("" if span is None else f" ({span:.3f} s)")
    )
    lost = info["rows_lost"]
    lines.append(f"rows lost by the capture: {'unknown (no summary)' if lost is None else f'{lost:,}'}")
    conns = info["connections"]
    lines.append(f"\nconnections: {len(conns)}")
    if conns:
        rows = [
            [
                c["connection_id"],
                c["client_address"] or "-",
                c["upstream_address"] or "-",
                _time(c["opened_wall_ns"]),
                _time(c["closed_wall_ns"]),
                f"{c['frames']:,}",
                f"{c['repairs']:,}",
                c["close_reason"] or ("-" if c["closed_wall_ns"] is None else ""),
            ]
            for c in conns[:max_connections]
        ]
        header = ["id", "client", "upstream", "opened", "closed", "frames", "repairs", "close reason"]
        lines += _table(header, rows)
        if len(conns) > max_connections:
            lines.append(f"  ... {len(conns) - max_connections} more")
    lines.append("\nframes:")
    if info["frames"]:
        rows = [
            [
                f["side"] or "-",
                f["direction"] or "-",
                "-" if f["api_key"] is None else f"{f['api']} ({f['api_key']})",
                f"{f['frames']:,}",
                f"{f['bytes']:,}",
            ]
            for f in info["frames"]
        ]
        lines += _table(["side", "direction", "api", "frames", "bytes"], rows)
    else:
        lines.append("  none")
    lines.append("\nrepair events:")
    if info["repairs"]:
        lines += _table(["event", "count"], [[k, f"{v:,}"] for k, v in info["repairs"].items()])
    else:
        lines.append("  none")
    return "\n".join(lines)


# -- command line ----------------------------------------------------------------------


def add_info_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("capture", type=Path, metavar="DIR", help="capture directory (or one capture file)")
    parser.add_argument("--json", action="store_true", help="print the totals as one JSON object")
    parser.add_argument(
        "--max-connections", type=int, default=50, metavar="N", help="connections listed (default 50)"
    )


def run_info(args: argparse.Namespace) -> int:
    if not args.capture.exists():
        print(f"corrfix capture info: {args.capture} does not exist")
        return 2
    info = capture_info(args.capture)
    print(json.dumps(info, indent=2) if args.json else render_info(info, args.max_connections))
    return 0
