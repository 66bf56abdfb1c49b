"""The audit job: load a capture, run the chosen checks, return the report as a dict.

The header checks (ordering, client view, latency) are computed per connection in Python,
before any row reaches the JVM (:mod:`spark_audit.connections`: whole connections per
partition): the JVM gets their anomalies, latency summaries and slow-request candidates
(the audit table), not a row per request. The body checks (storms, offsets, produce)
share the facts decoded from the broker-side bodies, and stay Spark SQL across connections.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from spark_audit._catalog import CHECKS, SEVERITIES
from spark_audit._progress import Progress
from spark_audit._tally import FINDING_TAG, as_json, finding_rows, tally_rows, tally_tables
from spark_audit.checks import (
    GROUP_ACTIVITY,
    HOME,
    Clusters,
    duplicates_of_sends,
    error_storms,
    isr_shrinks,
    leader_changes,
    offset_losses,
    rebalances,
    sequence_problems,
    slow_requests,
)
from spark_audit.connections import (
    BATCH_SENDS_SCHEMA,
    FACT_COLUMNS,
    PAIRS_SCHEMA,
    PARTS,
    load_audit_input,
    load_facts,
    load_transactions,
    merge_summaries,
)
from spark_audit.report import (
    client_view_findings,
    duplicate_findings,
    error_name,
    isr_shrink_findings,
    leader_change_findings,
    offset_loss_findings,
    rebalance_findings,
    sequence_findings,
    slow_findings,
    storm_findings,
    upstream_skip_findings,
    upstream_stray_findings,
)
from spark_audit.source import Via, is_local, list_files

REPORT_FORMAT = "corrfix-audit-report"
REPORT_VERSION = 7
"""7: committed offsets, produce duplicates and producer sequences are per cluster: each
connection's cluster is the one its answers (Metadata v2+, DescribeCluster) named, else the
one its upstream address named on another connection, else the audit's only cluster; the
``committed_offset_lost``, ``appended_twice``, ``possible_duplicate`` and sequence findings
carry ``cluster_id``, and the facts gain one ``connection`` row per connection (its
``upstream_address`` and the cluster its answers named); an OffsetFetch without
``require_stable`` answered within a second of a transaction's EndTxn answer is not
compared with that transaction's offsets (the commit marker may not be there yet), and the
facts' OffsetFetch ``group`` rows carry ``require_stable``.

6: groups on KIP-848's consumer protocol count in the rebalances: a ConsumerGroupHeartbeat
that sends member epoch 0 is a join, -1 or -2 a leave, and a member epoch its answer hands
out other than the one sent is a generation (a window with one is reported); its errors
FENCED_MEMBER_EPOCH and UNRELEASED_INSTANCE_ID, and STALE_MEMBER_EPOCH, count in the
``rebalance`` category and as rebalance errors; a TxnOffsetCommit's offsets are commits
for ``committed_offset_lost`` once their transaction's EndTxn committed it, and the facts
gain ``txn_commit``, ``txn_abort`` and ``txn_end_ack`` rows and TxnOffsetCommit ``commit``
rows; an idempotent batch that takes the sequences of a batch the broker refused, or
starts again at 0 after UNKNOWN_PRODUCER_ID, is no ``sequence_reused``; the facts'
``leader`` rows carry the answer's ``cluster_id``, and leader changes and ISR shrinks are
per cluster (their ``storms`` rows carry ``cluster_id``).

5: ISR shrinks seen in Metadata answers (fewer in-sync replicas than replicas, once per
shrink however many clients saw it) count in the ``isr_shrink`` category of the error
windows (their new ``isr_shrinks`` column), and each gives an ``isr_shrink`` finding and a
``storms.isr_shrinks`` row (how long the partition was under-replicated, its smallest
ISR); the facts' ``leader`` rows carry ``isr_size`` and ``replica_size``.

4: a Produce send answered NOT_ENOUGH_REPLICAS_AFTER_APPEND or REQUEST_TIMED_OUT counts
as unanswered (the leader appended it), so its acknowledged retry is ``possible_duplicate``;
a Metadata answer without leader epochs (before v7) naming a leader that answers with
epochs named is no leader change; a Metadata answer's LEADER_NOT_AVAILABLE on a topic
being auto-created is no ``leader_election`` error; an OffsetDelete request explains a
``committed_offset_lost`` as a DeleteGroups request does, and a deletion the broker
refused explains none; FENCED_LEADER_EPOCH and UNKNOWN_LEADER_EPOCH count in the
``leader_election`` category; a Heartbeat answered REBALANCE_IN_PROGRESS no longer counts
in the ``rebalance`` category of the error windows.

3: a batch without a producer id is identified by topic, partition, CRC, record count,
first timestamp and batch length (not by the CRC alone), and duplicate findings carry
``first_timestamp``, ``batch_length`` and ``corrfix_resends``.

2: ``latency`` always present; ``storms.windows`` and ``storms.rebalances`` rows carry
``capture_ids``, and storm findings the ``capture_id`` when one capture; an error storm of
the rebalance category is ``rebalance_error_storm``; ``possible_duplicate`` needs two sends
acknowledged or unanswered; ``unanswered_at_close`` is info when the close row names lost
answer bytes; on wire captures a client-view finding that a capture gap explains is
``capture_gap`` (info)."""
BODY_CHECKS = frozenset({"storms", "offsets", "produce"})
PAIRS_COLUMNS = PAIRS_SCHEMA.names
FINDING_SCHEMA = (
    "check string, kind string, severity string, capture_id string, connection_id string, "
    "wall_ns long, api_key short, summary string, details string"
)


@dataclass
class AuditOptions:
    """What to audit and how; the command line maps onto this one to one."""

    path: str
    checks: tuple[str, ...] = tuple(CHECKS)
    window_s: float = 10.0
    slow_factor: float = 10.0
    slow_min_ms: float = 100.0
    storm_threshold: int = 10
    rebalance_threshold: int = 3
    max_findings: int = 1000
    via: Via = "auto"
    tables: str | None = None


@dataclass(frozen=True)
class _Table:
    """A report table: its rows as JSON, sorted by the ``order`` columns on the driver (a
    report table is small; sorting it in Spark would cost a shuffle to one partition)."""

    name: str
    df: DataFrame
    order: tuple[str, ...]


def _ascending(row: dict[str, Any], order: Sequence[str]) -> tuple[tuple[bool, Any], ...]:
    """Spark's ascending order of ``row`` by ``order``: nulls first."""
    return tuple((row[c] is not None, row[c]) if row[c] is not None else (False, 0) for c in order)


def _collect(
    tables: list[_Table], findings: dict[str, DataFrame], options: AuditOptions, on_driver: bool
) -> dict[str, list[dict[str, Any]]]:
    """Every report table and the findings in one Spark action (each action costs a job,
    whatever its size): rows grouped by tag, in order. The findings are counted and ranked
    in Spark, or, when ``on_driver``, collected and counted and ranked here
    (:mod:`spark_audit._tally`)."""
    parts = [as_json(t.df, t.name) for t in tables]
    if findings:
        if on_driver:
            parts.append(finding_rows(findings, options.window_s))
        else:
            parts += tally_tables(findings, options.window_s, options.max_findings)
    rows = functools.reduce(DataFrame.unionByName, parts).collect() if parts else []
    raw = [(row["tag"], row["json"]) for row in rows if row["tag"].startswith(FINDING_TAG)]
    out: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for row in rows:
        if not row["tag"].startswith(FINDING_TAG):
            out.setdefault(row["tag"], []).append((row["n"], json.loads(row["json"])))
    got = {tag: [value for _, value in sorted(got, key=lambda item: item[0])] for tag, got in out.items()}
    if on_driver:
        got["counts"], top = tally_rows(raw, options.max_findings)
        got.update(top)
    for table in tables:
        if table.name in got:
            got[table.name].sort(key=lambda row: _ascending(row, table.order))
    return got


class _Collector:
    """Findings of every check: counts by kind and severity, the first ``limit`` rows by
    severity then time, and counts per time window for the timeline."""

    def __init__(self) -> None:
        self.checks: dict[str, dict[str, Any]] = {}
        self.timeline: list[dict[str, Any]] = []

    def add(
        self, chosen: list[str], counts: list[dict[str, Any]], top: dict[str, list[dict[str, Any]]]
    ) -> None:
        per_check: dict[str, dict[tuple[str, str], int]] = {name: {} for name in chosen}
        marks: dict[tuple[str, int, str], dict[str, Any]] = {}
        for row in counts:
            check, key = row["_check"], (row["kind"], row["severity"])
            per_check[check][key] = per_check[check].get(key, 0) + row["count"]
            if row["window_start_ns"] is not None:
                start, severity = row["window_start_ns"], row["severity"]
                mark = marks.setdefault(
                    (check, start, severity),
                    {"check": check, "window_start_ns": start, "severity": severity, "count": 0, "kinds": {}},
                )
                mark["count"] += row["count"]
                mark["kinds"][row["kind"]] = mark["kinds"].get(row["kind"], 0) + row["count"]
        self.timeline.extend(marks.values())
        for check in chosen:
            counted = per_check[check]
            total = sum(counted.values())
            found = top.get(f"top:{check}", [])
            self.checks[check] = {
                "counts": [{"kind": k, "severity": s, "count": n} for (k, s), n in sorted(counted.items())],
                "findings": found,
                "total": total,
                "truncated": total > len(found),
            }


_SMALL = ("connection", "latency", "sizes")
"""The parts of the audit table the driver reads before the checks run: the report's
captures, the latency summaries, and how many rows each other part has."""
_BY_API_SCHEMA = "api_key short, requests long, p50_ms double, p99_ms double, max_ms double"
DRIVER_TALLY_ROWS = 100_000
"""The most input rows (anomalies, slow candidates and facts) whose findings are counted and
ranked on the driver (:func:`spark_audit._tally.tally_rows`): no check finds more findings
than it has input rows, and below this a Spark ``groupBy`` and window cost more than the rows."""


def _read_small(
    audit: DataFrame, facts: DataFrame | None
) -> tuple[list[Row], list[Row], dict[str, int], Clusters]:
    """The audit table's connection and latency rows, the facts' counts, the rows of each
    part of the audit table and the connections' clusters (their homes, resolved on the
    driver), in one Spark action, which also fills the caches (none for a small capture:
    :func:`spark_audit.connections.load_audit_input`)."""
    small = audit.filter(F.col("part").isin(*_SMALL))
    if facts is not None:
        counts = facts.filter(F.col("kind").isin("fact_count", "sizes")).select(
            F.concat(F.lit("facts:"), F.col("kind")).alias("part"), "fact", "rows"
        )
        homes = facts.filter((F.col("kind") == "fact") & (F.col("fact") == "connection")).select(
            F.lit("facts:connection").alias("part"), *HOME
        )
        small = small.unionByName(counts, allowMissingColumns=True).unionByName(
            homes, allowMissingColumns=True
        )
    rows = small.collect()
    clusters = Clusters.of_homes(
        (row["upstream_address"], row["cluster_id"]) for row in rows if row["part"] == "facts:connection"
    )
    part_rows: dict[str, int] = {}
    for row in rows:
        if row["part"] == "sizes":
            part_rows[row["counted"]] = part_rows.get(row["counted"], 0) + row["rows"]
        elif row["part"] == "facts:sizes":
            name = f"facts:{row['fact']}"
            part_rows[name] = part_rows.get(name, 0) + row["rows"]
    return (
        [r for r in rows if r["part"] in ("connection", "latency")],
        [r for r in rows if r["part"] == "facts:fact_count"],
        part_rows,
        clusters,
    )


def _captures(connections: list[Row]) -> list[dict[str, Any]]:
    """Rows, frames, repairs, connections and time span per capture and source."""
    per: dict[tuple[str, str], dict[str, Any]] = {}
    for c in connections:
        got = per.setdefault(
            (c["capture_id"], c["source"]),
            {
                "capture_id": c["capture_id"],
                "source": c["source"],
                "rows": 0,
                "frames": 0,
                "repairs": 0,
                "connections": 0,
                "first_wall_ns": None,
                "last_wall_ns": None,
            },
        )
        for name in ("rows", "frames", "repairs"):
            got[name] += c[name] or 0
        got["connections"] += 1
        for name, pick in (("first_wall_ns", min), ("last_wall_ns", max)):
            if c[name] is not None:
                got[name] = c[name] if got[name] is None else pick(got[name], c[name])
    return sorted(per.values(), key=lambda r: (r["first_wall_ns"] is not None, r["first_wall_ns"] or 0))


def _decoded(counts: list[Row]) -> dict[str, Any]:
    """Facts decoded, by kind (before each Produce answer was merged into its batch)."""
    by_fact: dict[str, int] = {}
    for row in counts:
        by_fact[row["fact"]] = by_fact.get(row["fact"], 0) + (row["rows"] or 0)
    return {"facts": dict(sorted(by_fact.items()))}


class _AuditRun:
    """One audit: the audit table and the facts, each read once and cached, and what each
    check adds to the report's tables and findings (plain DataFrames: nothing runs until
    :func:`_collect`). Checks 1 and 2 and the latency numbers come from the pass
    (:func:`spark_audit.connections.audit_pass`); Spark only shapes them into findings."""

    def __init__(
        self,
        audit: DataFrame,
        facts: DataFrame | None,
        options: AuditOptions,
        by_api: list[dict[str, Any]],
        fact_kinds: frozenset[str] = frozenset(),
        part_rows: dict[str, int] | None = None,
        clusters: Clusters | None = None,
    ) -> None:
        self.audit = audit
        self.clusters = clusters
        self.all_facts = facts
        self.options = options
        self.by_api = by_api
        self.fact_kinds = fact_kinds
        self.part_rows = part_rows
        self.tables: list[_Table] = []

    def _lacks(self, *needed: str) -> bool:
        """Whether the capture decoded none of the facts a check needs (any of ``needed``):
        then the check finds nothing, and its plan, a few Spark stages of empty data, is
        not built at all."""
        return not self.fact_kinds.intersection(needed)

    def part(self, name: str) -> DataFrame | None:
        """The rows of one part of the audit table, with that part's own columns; None when
        the part is known to be empty (then its findings' plan is not built)."""
        if self.part_rows is not None and not self.part_rows.get(name):
            return None
        return self.audit.filter(F.col("part") == name).select(*PARTS[name].names)

    @functools.cached_property
    def facts(self) -> DataFrame:
        """The ``fact`` rows: every fact but the sends of batches without a producer id."""
        assert self.all_facts is not None, "the facts are read when a body check runs"
        return self.all_facts.filter(F.col("kind") == "fact").select(*FACT_COLUMNS)

    @functools.cached_property
    def batch_sends(self) -> DataFrame:
        """The sends of batches without a producer id, summed per batch and partition."""
        assert self.all_facts is not None, "the facts are read when a body check runs"
        return self.all_facts.filter(F.col("kind") == "batch_sends").select(*BATCH_SENDS_SCHEMA.names)

    def upstream_ordering(self) -> DataFrame | None:
        skips, strays = self.part("skip"), self.part("stray")
        found = [upstream_skip_findings(skips)] if skips is not None else []
        found += [upstream_stray_findings(strays)] if strays is not None else []
        return functools.reduce(DataFrame.unionByName, found) if found else None

    def client_view(self) -> DataFrame | None:
        client = self.part("client")
        return None if client is None else client_view_findings(client)

    def latency(self) -> DataFrame | None:
        o = self.options
        slow = self.part("slow")
        if slow is None:
            return None
        by_api = self.audit.sparkSession.createDataFrame(
            [tuple(r[c] for c in ("api_key", "requests", "p50_ms", "p99_ms", "max_ms")) for r in self.by_api],
            _BY_API_SCHEMA,
        )
        return slow_findings(slow_requests(slow, by_api, o.slow_factor, o.slow_min_ms))

    def storms(self) -> DataFrame | None:
        if self._lacks("error", "leader", "group"):  # the storms' and rebalances' only inputs
            return None
        o = self.options
        windows = error_storms(self.facts, o.window_s, o.storm_threshold)
        groups = rebalances(self.facts, o.window_s, o.rebalance_threshold)
        changes = leader_changes(self.facts)
        self.tables.append(_Table("storms.windows", windows, ("window_start_ns", "category")))
        self.tables.append(
            _Table("storms.rebalances", groups.filter(GROUP_ACTIVITY), ("window_start_ns", "group_id"))
        )
        shrinks = isr_shrinks(self.facts)
        self.tables.append(_Table("storms.leader_changes", changes, ("wall_ns", "topic", "partition")))
        self.tables.append(_Table("storms.isr_shrinks", shrinks, ("wall_ns", "topic", "partition")))
        return (
            storm_findings(windows, o.window_s)
            .unionByName(rebalance_findings(groups, o.window_s))
            .unionByName(leader_change_findings(changes))
            .unionByName(isr_shrink_findings(shrinks))
        )

    def offsets(self) -> DataFrame | None:
        if any(self._lacks(kind) for kind in ("commit", "commit_ack", "fetched_offset")):  # inner joins
            return None
        return offset_loss_findings(offset_losses(self.facts, self.clusters))

    def _has_facts(self, name: str) -> bool:
        """Whether the facts table has rows of ``name`` (a fact, or ``batch_sends``) after
        the pass's merge and sums; True when that is not known."""
        return self.part_rows is None or bool(self.part_rows.get(f"facts:{name}"))

    def produce(self) -> DataFrame | None:
        if self._lacks("produce_batch"):
            return None
        found = []
        if self._has_facts("batch_sends"):
            found.append(duplicate_findings(duplicates_of_sends(self.batch_sends, self.facts, self.clusters)))
        if self._has_facts("produce_batch"):  # batches with a producer id
            found.append(sequence_findings(sequence_problems(self.facts, self.clusters)))
        return functools.reduce(DataFrame.unionByName, found) if found else None


TABLES = ("transactions", "facts", "anomalies")


def write_tables(run: _AuditRun, findings: dict[str, DataFrame], directory: str) -> None:
    """The three tables as Parquet under ``directory`` (one action each): ``transactions``,
    one row per request with its answer (client side; upstream: the overtaken sends) and per
    stray answer, with ``latency_ms``; ``facts``, what the bodies said; ``anomalies``, every
    finding of the checks that ran. The transactions, and the facts with a row per send, are
    read only here: the audit itself needs neither a row per request nor one per batch sent
    in the JVM."""
    o = run.options
    spark = run.audit.sparkSession
    frames = load_transactions(spark, o.path, o.via).filter(F.col("kind") == "frame")
    latency = F.when(F.col("answer_mono_ns").isNotNull(), (F.col("answer_mono_ns") - F.col("mono_ns")) / 1e6)
    transactions = frames.select(
        "capture_id", "source", "connection_id", "side", *PAIRS_COLUMNS[2:], latency.alias("latency_ms")
    )
    facts = load_facts(spark, o.path, o.via).filter(F.col("kind") == "fact").select(*FACT_COLUMNS)
    empty = spark.createDataFrame([], FINDING_SCHEMA)
    anomalies = functools.reduce(DataFrame.unionByName, findings.values(), empty)
    for name, df in zip(TABLES, (transactions, facts, anomalies), strict=True):
        df.write.mode("overwrite").parquet(f"{directory.rstrip('/')}/{name}")


def run_audit(spark: SparkSession, options: AuditOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Run the chosen checks over the capture at ``options.path``; the report as a dict.

    Two Spark actions, whatever the capture and the checks (and one per table for
    ``--tables``): one reads the capture into the cached audit table and facts (the facts
    only for the body checks) and collects the captures' counts, the facts' counts and the
    latency summaries; one collects every report table and finding."""
    started = time.monotonic()
    unknown = sorted(set(options.checks) - set(CHECKS))
    if unknown:
        raise ValueError(f"unknown checks: {', '.join(unknown)}")
    chosen = [c for c in CHECKS if c in options.checks]
    progress = progress or Progress(None, quiet=True)
    progress.total = 3 if options.tables else 2
    if is_local(options.path) and not list_files(options.path):
        raise FileNotFoundError(f"no capture files (*.arrows) under {options.path}")
    report: dict[str, Any] = {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "input": options.path,
        "options": {k: v for k, v in asdict(options).items() if k != "path"},
        "spark": {"version": spark.version, "master": spark.sparkContext.master},
    }
    bodies = BODY_CHECKS.intersection(chosen)
    audit, facts, cached = load_audit_input(
        spark, options.path, options.via, options.window_s, options.slow_min_ms, with_facts=bool(bodies)
    )
    for df in cached:
        df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        with progress.step("reading the capture"):
            small, counts, part_rows, clusters = _read_small(audit, facts)
            report["captures"] = _captures([r for r in small if r["part"] == "connection"])
            if facts is not None:
                report["decode"] = _decoded(counts)
            by_api, by_window = merge_summaries(r.asDict() for r in small if r["part"] == "latency")
        with progress.step("running the checks"):
            decoded: dict[str, int] = report.get("decode", {}).get("facts", {})
            kinds = frozenset(k for k, n in decoded.items() if n)
            run = _AuditRun(audit, facts, options, by_api, kinds, part_rows, clusters)
            planned = {check: getattr(run, check)() for check in chosen}
            findings = {check: df for check, df in planned.items() if df is not None}
            anomalies = sum(n for part, n in part_rows.items() if part not in _SMALL and ":" not in part)
            inputs = anomalies + sum(decoded.values())
            got = _collect(run.tables, findings, options, on_driver=inputs <= DRIVER_TALLY_ROWS)
            got.update({"latency.by_api": by_api, "latency.by_window": by_window})
        if options.tables:
            with progress.step("writing the tables"):
                write_tables(run, findings, options.tables)
    finally:
        for df in cached:
            df.unpersist()
    _fill(report, got)
    out = _Collector()
    out.add(chosen, got.get("counts", []), got)
    report["checks"] = {name: {"title": CHECKS[name], **out.checks[name]} for name in chosen}
    report["timeline"] = sorted(out.timeline, key=lambda r: (r["window_start_ns"], r["check"], r["severity"]))
    report["summary"] = _summary(report["checks"])
    report["elapsed_s"] = round(time.monotonic() - started, 3)
    return report


def _fill(report: dict[str, Any], got: dict[str, list[dict[str, Any]]]) -> None:
    """The report's tables from the collected rows, in the report's order of keys."""
    report["latency"] = {
        "by_api": got.get("latency.by_api", []),
        "by_window": got.get("latency.by_window", []),
    }
    if "storms" in report["options"]["checks"]:
        windows = got.get("storms.windows", [])
        for row in windows:
            row["error_names"] = [error_name(c) for c in row["error_codes"]]
        report["storms"] = {
            "windows": windows,
            "rebalances": got.get("storms.rebalances", []),
            "leader_changes": got.get("storms.leader_changes", []),
            "isr_shrinks": got.get("storms.isr_shrinks", []),
        }


def _summary(checks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    by_severity = dict.fromkeys(SEVERITIES, 0)
    by_check: dict[str, dict[str, int]] = {}
    for name, entry in checks.items():
        per = dict.fromkeys(SEVERITIES, 0)
        for count in entry["counts"]:
            per[count["severity"]] += count["count"]
            by_severity[count["severity"]] += count["count"]
        by_check[name] = per
    worst = next((s for s in reversed(SEVERITIES) if by_severity[s]), None)
    return {
        "findings": sum(by_severity.values()),
        "by_severity": by_severity,
        "by_check": by_check,
        "worst": worst,
    }
