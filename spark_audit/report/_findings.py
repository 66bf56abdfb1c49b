"""Check results as findings, one schema for every check: ``check, kind, severity,
capture_id, connection_id, wall_ns, api_key, summary, details``. Severities are
:data:`spark_audit.SEVERITIES`; ``summary`` is a sentence for people; ``details`` keeps the
check's whole row as JSON, so the report loses nothing a check found.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_audit.checks import GROUP_ACTIVITY
from spark_audit.report._names import api_name_column


def _finding(
    df: DataFrame,
    check: str,
    kind: Column,
    severity: Column,
    summary: Column,
    capture_id: Column | None = None,
    connection_id: Column | None = None,
    wall_ns: Column | None = None,
    api_key: Column | None = None,
) -> DataFrame:
    def or_null(column: Column | None, name: str, kind_: str) -> Column:
        if column is not None:
            return column
        return F.col(name) if name in df.columns else F.lit(None).cast(kind_)

    return df.select(
        F.lit(check).alias("check"),
        kind.alias("kind"),
        severity.alias("severity"),
        or_null(capture_id, "capture_id", "string").alias("capture_id"),
        or_null(connection_id, "connection_id", "string").alias("connection_id"),
        or_null(wall_ns, "wall_ns", "long").cast("long").alias("wall_ns"),
        or_null(api_key, "api_key", "short").cast("short").alias("api_key"),
        summary.alias("summary"),
        F.to_json(F.struct(*[F.col(c) for c in df.columns])).alias("details"),
    )


def upstream_skip_findings(skips: DataFrame) -> DataFrame:
    severity = (
        F.when(F.col("outcome") == "unrepaired", "error")
        .when(F.col("outcome") == "probe_lost", "info")
        .otherwise("warning")
    )
    what = F.when(F.col("probe"), F.lit("probe")).otherwise(api_name_column(F.col("api_key")))
    by = F.when(F.col("overtaken_by_probe"), F.lit("probe")).otherwise(
        api_name_column(F.col("overtaken_by_api_key"))
    )
    summary = F.format_string(
        "answer to %s (upstream id %d%s) lost: overtaken by %s (upstream id %d)%s; corrfix: %s%s",
        what,
        F.col("upstream_correlation_id"),
        F.coalesce(F.format_string(", client id %d", F.col("client_correlation_id")), F.lit("")),
        by,
        F.col("overtaken_by"),
        F.when(F.col("answered_late"), F.lit(", then answered late")).otherwise(F.lit("")),
        F.when(F.size("actions") > 0, F.array_join("actions", ", ")).otherwise(F.lit("nothing")),
        F.coalesce(F.format_string(" (re-sent as %d)", F.col("requeued_as")), F.lit("")),
    )
    return _finding(skips, "upstream_ordering", F.concat(F.lit("skip_"), F.col("outcome")), severity, summary)


def upstream_stray_findings(strays: DataFrame) -> DataFrame:
    severity = F.when(F.col("dropped"), "info").otherwise("warning")
    summary = F.format_string(
        "stray upstream answer (%s) to %s, upstream id %d; %s",
        F.col("kind"),
        api_name_column(F.col("api_key")),
        F.col("upstream_correlation_id"),
        F.when(F.col("dropped"), F.lit("corrfix dropped it")).otherwise(F.lit("no stale_drop logged")),
    )
    return _finding(strays, "upstream_ordering", F.concat(F.lit("stray_"), F.col("kind")), severity, summary)


def _client_text(kind: str) -> Column:
    related = F.coalesce(F.col("related_correlation_id").cast("string"), F.lit("?"))
    reason = F.coalesce(F.col("close_reason"), F.lit("no reason"))
    texts = {
        "out_of_order": F.concat(F.lit("answered after a later request's answer (id "), related, F.lit(")")),
        "answer_missing": F.concat(
            F.lit("never answered, though a later request (id "), related, F.lit(") was")
        ),
        "orphan": F.lit("an answer to no outstanding request"),
        "duplicate": F.lit("a second answer"),
        "acks0_reply": F.lit("an answer to a Produce with acks=0"),
        "unanswered_at_close": F.concat(F.lit("unanswered when the connection closed ("), reason, F.lit(")")),
        "unanswered_at_capture_end": F.lit("unanswered when the capture ended"),
        "id_not_increasing": F.concat(
            F.lit("correlation id not above the previous one ("), related, F.lit(")")
        ),
    }
    return texts[kind]


LOST_ANSWER_BYTES = "(^|,)response_(gap|skipped)="
"""A wire capture's close row saying answer bytes after the last answer were not captured
or not framed: the answer owed may be in them, so the bytes prove no fault."""


def client_view_findings(violations: DataFrame) -> DataFrame:
    kind = F.col("kind")
    gap = F.col("capture_gap").isNotNull()
    severity = (
        F.when(gap, "info")
        .when(kind.isin("out_of_order", "answer_missing", "orphan", "duplicate", "acks0_reply"), "error")
        .when(kind == "unanswered_at_capture_end", "info")
        .when((kind == "unanswered_at_close") & F.col("close_reason").startswith("client"), "info")
        .when((kind == "unanswered_at_close") & F.col("close_reason").rlike(LOST_ANSWER_BYTES), "info")
        .otherwise("warning")
    )
    text = F.lit("")
    for name in (
        "out_of_order",
        "answer_missing",
        "orphan",
        "duplicate",
        "acks0_reply",
        "unanswered_at_close",
        "unanswered_at_capture_end",
        "id_not_increasing",
    ):
        text = F.when(kind == name, _client_text(name)).otherwise(text)
    summary = F.concat(
        F.format_string("%s id %d: ", api_name_column(F.col("api_key")), F.col("correlation_id")),
        text,
        F.when(gap, F.concat(F.lit("; a capture gap, not a fault: "), F.col("capture_gap"))).otherwise(""),
    )
    shown = F.when(gap, F.lit("capture_gap")).otherwise(kind)
    return _finding(violations, "client_view", shown, severity, summary)


def slow_findings(slow: DataFrame) -> DataFrame:
    summary = F.format_string(
        "%s id %d took %.1f ms (p50 %.1f ms, p99 %.1f ms for this api)",
        api_name_column(F.col("api_key")),
        F.col("correlation_id"),
        F.col("latency_ms"),
        F.col("p50_ms"),
        F.col("p99_ms"),
    )
    return _finding(slow, "latency", F.lit("slow_request"), F.lit("warning"), summary)


def storm_findings(windows: DataFrame, window_s: float) -> DataFrame:
    storms = windows.filter("storm")
    shrinks = F.col("category") == "isr_shrink"
    summary = F.format_string(
        f"%s storm: %d errors and %d %s in {window_s:g} s, on %d connections",
        F.col("category"),
        F.col("errors"),
        F.when(shrinks, F.col("isr_shrinks")).otherwise(F.col("leader_changes")),
        F.when(shrinks, F.lit("ISR shrinks")).otherwise(F.lit("leader changes")),
        F.col("connections"),
    )
    kind = F.when(F.col("category") == "rebalance", F.lit("rebalance_error_storm")).otherwise(
        F.concat(F.col("category"), F.lit("_storm"))
    )
    return _finding(
        storms,
        "storms",
        kind,
        F.lit("warning"),
        summary,
        capture_id=_only_capture(),
        wall_ns=F.col("window_start_ns"),
    )


def _only_capture() -> Column:
    """The capture a storm came from, when it came from one (else null)."""
    return F.when(F.size("capture_ids") == 1, F.col("capture_ids").getItem(0))


def rebalance_findings(groups: DataFrame, window_s: float) -> DataFrame:
    active = groups.filter(GROUP_ACTIVITY)
    summary = F.format_string(
        f"group %s in {window_s:g} s: %d joins, %d SyncGroup, %d leaves, generations [%s], "
        "%d rebalance errors",
        F.col("group_id"),
        F.col("joins"),
        F.col("syncs"),
        F.col("leaves"),
        F.array_join(F.col("generations").cast("array<string>"), ", "),
        F.col("rebalance_errors"),
    )
    severity = F.when(F.col("storm"), "warning").otherwise("info")
    kind = F.when(F.col("storm"), F.lit("rebalance_storm")).otherwise(F.lit("rebalance"))
    return _finding(
        active,
        "storms",
        kind,
        severity,
        summary,
        capture_id=_only_capture(),
        wall_ns=F.col("window_start_ns"),
    )


def leader_change_findings(changes: DataFrame) -> DataFrame:
    summary = F.format_string(
        "%s-%d leader %d -> %d (epoch %s -> %s)",
        F.col("topic"),
        F.col("partition"),
        F.col("from_leader"),
        F.col("to_leader"),
        F.coalesce(F.col("from_epoch").cast("string"), F.lit("?")),
        F.coalesce(F.col("to_epoch").cast("string"), F.lit("?")),
    )
    return _finding(changes, "storms", F.lit("leader_change"), F.lit("info"), summary)


def isr_shrink_findings(shrinks: DataFrame) -> DataFrame:
    """One per ISR shrink: info when every replica was back in sync within the capture,
    warning when the partition was still under-replicated at its last answer."""
    back = F.col("expanded_wall_ns").isNotNull()
    summary = F.format_string(
        "%s-%d under-replicated: %d of %d replicas in sync at the fewest, for %s%.1f ms%s",
        F.col("topic"),
        F.col("partition"),
        F.col("min_isr"),
        F.col("replicas"),
        F.when(back, F.lit("")).otherwise(F.lit("at least ")),
        F.col("under_replicated_ms"),
        F.when(back, F.lit(", then back in sync")).otherwise(F.lit(", still short at its last answer")),
    )
    severity = F.when(back, "info").otherwise("warning")
    return _finding(shrinks, "storms", F.lit("isr_shrink"), severity, summary)


def offset_loss_findings(losses: DataFrame) -> DataFrame:
    explained = F.col("deleted_wall_ns").isNotNull()
    summary = F.format_string(
        "group %s lost its committed offset for %s-%d: last committed %d, then OffsetFetch found none%s",
        F.col("group_id"),
        F.col("topic"),
        F.col("partition"),
        F.col("last_offset"),
        F.when(explained, F.lit(" (the group's offsets were deleted in between)")).otherwise(F.lit("")),
    )
    return _finding(
        losses,
        "offsets",
        F.lit("committed_offset_lost"),
        F.when(explained, "warning").otherwise("error"),
        summary,
    )


def duplicate_findings(dups: DataFrame) -> DataFrame:
    summary = F.format_string(
        "batch of %d records to %s-%d (crc %d) sent %d times, %d acknowledged",
        F.col("record_count"),
        F.col("topic"),
        F.col("partition"),
        F.col("crc"),
        F.col("sends"),
        F.col("acknowledged"),
    )
    severity = F.when(F.col("kind") == "appended_twice", "error").otherwise("warning")
    return _finding(dups, "produce", F.col("kind"), severity, summary, api_key=F.lit(0))


def sequence_findings(problems: DataFrame) -> DataFrame:
    summary = F.format_string(
        "producer %d epoch %d on %s-%d: base sequence %d, expected %s (%d records, sent %d times)",
        F.col("producer_id"),
        F.col("producer_epoch"),
        F.col("topic"),
        F.col("partition"),
        F.col("base_sequence"),
        F.coalesce(F.col("expected_sequence").cast("string"), F.lit("-")),
        F.col("record_count"),
        F.col("sends"),
    )
    severity = (
        F.when(F.col("kind") == "sequence_reused", "error")
        .when(F.col("kind") == "sequence_gap", "warning")
        .otherwise("info")
    )
    return _finding(problems, "produce", F.col("kind"), severity, summary, api_key=F.lit(0))
