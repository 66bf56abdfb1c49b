"""How a replay differed from its capture: missing answers, error codes, latency per api key.

Error codes are compared, not whole responses: offsets, timestamps, broker addresses and
fetched data legitimately differ between brokers, while an error code that was 0 in the
capture and is not now (or the other way round) is what someone replaying traffic wants to
see. Every ``error_code`` field of the decoded response counts, wherever it is nested,
named by its path (``responses[topic].partition_responses[0].error_code``).
"""

from __future__ import annotations

import collections
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import kafka.errors

from corrfix.replay._plan import PlannedRequest
from protocol import api_name, response_body_offset, response_class

_LABEL_KEYS = ("name", "topic", "topic_name", "partition_index", "partition", "index", "api_key", "group_id")


class Status(StrEnum):
    ANSWERED = "answered"
    MISSING = "missing_response"
    NOT_SENT = "not_sent"
    SKIPPED = "skipped_truncated"
    NO_ANSWER_EXPECTED = "no_answer_expected"  # acks=0 Produce, sent and (rightly) not answered


@dataclass(slots=True)
class Outcome:
    """What happened to one planned request during the replay (times from the replay's clock)."""

    request: PlannedRequest
    status: Status = Status.NOT_SENT
    detail: str | None = None
    sent_ns: int | None = None
    response: bytes | None = None
    received_ns: int | None = None

    @property
    def replayed_latency_ns(self) -> int | None:
        if self.sent_ns is None or self.received_ns is None:
            return None
        return self.received_ns - self.sent_ns


@dataclass(slots=True)
class ReplayResult:
    target: str
    speed: float | None  # None: as fast as possible
    outcomes: list[Outcome]
    stray_responses: list[tuple[str, int]] = field(default_factory=list)  # (connection, correlation id)
    started_ns: int = 0  # the replay's time zero, on the clock of Outcome.sent_ns
    elapsed_s: float = 0.0
    topic_ids: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # TopicIdMap.summary()


def error_codes(frame: bytes | None, api_key: int | None, api_version: int | None) -> dict[str, int] | None:
    """Non-zero error codes of a response frame by path; None if it cannot be decoded."""
    if frame is None or api_key is None or api_version is None:
        return None
    cls = response_class(api_key)
    if cls is None or not cls.min_version <= api_version <= cls.max_version:
        return None
    try:
        body = bytes(frame[response_body_offset(frame, api_key, api_version) :])
        tree = cls.decode(body, version=api_version).to_dict(json=False)
    except Exception:  # ProtocolError, and kafka-python's assorted errors on malformed bodies
        return None
    found: dict[str, int] = {}
    _walk(tree, "", found)
    return found


def _walk(node: Any, path: str, found: dict[str, int]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "error_code" and isinstance(value, int):
                if value:
                    found[f"{path}.{key}" if path else key] = value
            else:
                _walk(value, f"{path}.{key}" if path else key, found)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            _walk(item, f"{path}[{_label(item, i)}]", found)


def _label(item: Any, position: int) -> object:
    """An array element's name (topic, partition index...) if it has one, else its position."""
    if isinstance(item, dict):
        for key in _LABEL_KEYS:
            if item.get(key) is not None:
                return item[key]
    return position


def error_name(code: int) -> str:
    cls = kafka.errors.for_code(code)
    return getattr(cls, "message", None) or cls.__name__


def _codes_text(codes: dict[str, int]) -> str:
    if not codes:
        return "none"
    return ", ".join(f"{path}={code} {error_name(code)}" for path, code in sorted(codes.items()))


def percentile(values: list[int], p: float) -> int | None:
    """Nearest-rank percentile."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(p / 100 * len(ordered)) - 1, 0)]


def _ms(ns: int | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)


def differences(outcome: Outcome) -> list[dict[str, Any]]:
    """How this request's replay differs from its capture (empty: it does not)."""
    request = outcome.request
    base = {
        "connection": request.connection_id,
        "seq": request.seq,
        "correlation_id": request.correlation_id,
        "api": api_name(request.api_key) if request.api_key is not None else None,
    }

    def diff(kind: str, detail: str) -> dict[str, Any]:
        return {**base, "kind": kind, "detail": detail}

    if outcome.status is Status.SKIPPED:
        detail = outcome.detail or f"captured {len(request.frame)} of {request.frame_length} bytes"
        return [diff("skipped_truncated", detail)]
    if outcome.status is Status.NOT_SENT:
        return [diff("not_sent", outcome.detail or "not sent")]
    if outcome.status is Status.MISSING:
        detail = outcome.detail or "no response"
        if request.captured_response is None:
            detail += " (the capture has no response either)"
        return [diff("missing_response", detail)]
    if not request.expects_response:
        captured, replayed = request.captured_response is not None, outcome.response is not None
        if captured != replayed:
            said = {True: "answered", False: "not answered"}
            detail = f"acks=0 request {said[captured]} in the capture, {said[replayed]} now"
            return [diff("acks0_answer", detail)]
        return []
    captured_frame = request.captured_response
    if captured_frame is None or request.captured_response_length != len(captured_frame):
        return []  # nothing whole to compare with
    before = error_codes(request.captured_response, request.api_key, request.api_version)
    after = error_codes(outcome.response, request.api_key, request.api_version)
    if before is None:
        return []
    if after is None:
        return [diff("undecodable_response", "the replayed response could not be decoded")]
    if before != after:
        return [diff("error_codes", f"captured: {_codes_text(before)}; replayed: {_codes_text(after)}")]
    return []


def build_report(result: ReplayResult) -> dict[str, Any]:
    """The report as JSON-ready data."""
    outcomes = result.outcomes
    diffs = [d for outcome in outcomes for d in differences(outcome)]
    diffs += [
        {"connection": conn, "seq": None, "correlation_id": cid, "api": None, "kind": "stray_response",
         "detail": "a response whose correlation id matches no outstanding request"}
        for conn, cid in result.stray_responses
    ]  # fmt: skip
    statuses = collections.Counter(outcome.status for outcome in outcomes)
    return {
        "target": result.target,
        "speed": result.speed,
        "elapsed_s": round(result.elapsed_s, 3),
        "connections": len({o.request.connection_id for o in outcomes}),
        "requests": len(outcomes),
        "sent": sum(1 for o in outcomes if o.sent_ns is not None),
        "answered": statuses[Status.ANSWERED],
        "missing_responses": statuses[Status.MISSING],
        "not_sent": statuses[Status.NOT_SENT],
        "skipped_truncated": statuses[Status.SKIPPED],
        "error_differences": sum(1 for d in diffs if d["kind"] == "error_codes"),
        "stray_responses": len(result.stray_responses),
        "differences_total": len(diffs),
        "by_api": _by_api(outcomes, diffs),
        "topic_ids": result.topic_ids or {"remapped": [], "missing_on_target": [], "unknown_in_capture": []},
        "differences": diffs,
    }


def _by_api(outcomes: Iterable[Outcome], diffs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[int | None, list[Outcome]] = collections.defaultdict(list)
    for outcome in outcomes:
        groups[outcome.request.api_key].append(outcome)
    diff_counts = collections.Counter((d["api"], d["kind"]) for d in diffs)
    rows = []
    for api_key in sorted(groups, key=lambda k: -1 if k is None else k):
        group = groups[api_key]
        name = api_name(api_key) if api_key is not None else "unknown"
        captured = [v for o in group if (v := o.request.captured_latency_ns) is not None]
        replayed = [v for o in group if (v := o.replayed_latency_ns) is not None]
        rows.append(
            {
                "api": name,
                "api_key": api_key,
                "requests": len(group),
                "answered": sum(1 for o in group if o.status is Status.ANSWERED),
                "missing_responses": sum(1 for o in group if o.status is Status.MISSING),
                "error_differences": diff_counts[(name if api_key is not None else None, "error_codes")],
                "captured_ms": {"p50": _ms(percentile(captured, 50)), "p99": _ms(percentile(captured, 99))},
                "replayed_ms": {"p50": _ms(percentile(replayed, 50)), "p99": _ms(percentile(replayed, 99))},
            }
        )
    return rows


def render_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2)


def render_text(report: dict[str, Any], max_differences: int = 50) -> str:
    speed = "as fast as possible" if report["speed"] is None else f"speed {report['speed']:g}x"
    lines = [
        f"replayed {report['requests']:,} requests on {report['connections']:,} connections "
        f"to {report['target']} ({speed}, {report['elapsed_s']:.2f} s)",
        f"  sent {report['sent']:,}, answered {report['answered']:,}, missing responses "
        f"{report['missing_responses']:,}, not sent {report['not_sent']:,}, skipped (truncated in the "
        f"capture) {report['skipped_truncated']:,}, error-code differences {report['error_differences']:,}, "
        f"stray responses {report['stray_responses']:,}",
        "",
        f"  {'api':<22} {'requests':>8} {'answered':>8} {'missing':>7} {'errors':>6}"
        f"  {'captured p50/p99 ms':>20}  {'replayed p50/p99 ms':>20}",
    ]
    for row in report["by_api"]:
        captured, replayed = _pair(row["captured_ms"]), _pair(row["replayed_ms"])
        lines.append(
            f"  {row['api']:<22} {row['requests']:>8,} {row['answered']:>8,} {row['missing_responses']:>7,} "
            f"{row['error_differences']:>6,}  {captured:>20}  {replayed:>20}"
        )
    lines += _topic_id_lines(report["topic_ids"])
    diffs = report["differences"]
    lines.append("")
    if not diffs:
        lines.append("no differences from the capture")
    else:
        lines.append(f"{len(diffs):,} differences from the capture:")
        for d in diffs[:max_differences]:
            where = f"{d['connection']} seq {d['seq']}" if d["seq"] is not None else d["connection"]
            api = f"{d['api']} " if d["api"] else ""
            lines.append(f"  {where}: {api}correlation id {d['correlation_id']}: {d['kind']}: {d['detail']}")
        if len(diffs) > max_differences:
            lines.append(f"  ... and {len(diffs) - max_differences:,} more (--json lists all)")
    return "\n".join(lines)


def _topic_id_lines(topic_ids: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Which captured topic ids were sent as the target's, and which could not be."""
    lines = []
    for entry in topic_ids.get("remapped", []):
        lines.append(
            f"  topic id of {entry['topic']!r} remapped {entry['capture_id']} -> {entry['target_id']} "
            f"in {entry['requests']:,} requests"
        )
    for entry in topic_ids.get("missing_on_target", []):
        lines.append(
            f"  topic {entry['topic']!r} is missing on the target: {entry['requests']:,} requests "
            "sent with the captured id"
        )
    for entry in topic_ids.get("unknown_in_capture", []):
        lines.append(
            f"  topic id {entry['capture_id']} is named by no answer in the capture: {entry['requests']:,} "
            "requests sent with it unchanged"
        )
    return ["", *lines] if lines else []


def _pair(values: dict[str, float | None]) -> str:
    if values["p50"] is None:
        return "-"
    return f"{values['p50']:.2f} / {values['p99']:.2f}"
