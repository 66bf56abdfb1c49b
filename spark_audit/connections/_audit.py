"""The audit table: what the default audit moves into the JVM from whole connections,
instead of one transaction row per request. Per partition, a few rows (``part``):

- ``connection``: one per connection, its counts and time span (the report's captures);
- ``skip``, ``stray``, ``client``: checks 1 and 2, computed in the pass (:mod:`._anomalies`);
- ``latency``: check 3's mergeable summaries (:mod:`._latency`), merged on the driver;
- ``slow``: the answered requests slower than the slow-request floor, the only latency rows
  a finding can come from;
- ``sizes``: how many rows each of the other parts has in this partition (``counted``,
  ``rows``), so that the driver knows which checks have input, and how much, without a
  Spark aggregation.

One schema for all of them (the union of their columns, null where a part has none): the
rows are few, so width costs nothing, and one table is one read and one cache. The audit
reads it together with the facts, as one table of both (:data:`AUDIT_AND_FACTS_SCHEMA`):
one plan of the capture, one gathering of its rows, one cache.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from spark_audit.connections._anomalies import (
    CLIENT_SCHEMA,
    SKIP_SCHEMA,
    STRAY_SCHEMA,
    client_violations,
    skipped_sends,
    stray_answers,
)
from spark_audit.connections._latency import (
    LATENCY_SCHEMA,
    SUMMARY_SCHEMA,
    answered_requests,
    slow_candidates,
    summaries,
)
from spark_audit.connections._pass import FACTS_SCHEMA, TRANSACTIONS_SCHEMA, _conform, connection_pass

CONNECTION_COLUMNS = (
    "capture_id",
    "connection_id",
    "source",
    "rows",
    "frames",
    "repairs",
    "first_wall_ns",
    "last_wall_ns",
)
PARTS: dict[str, pa.Schema] = {
    "connection": pa.schema([TRANSACTIONS_SCHEMA.field(c).with_nullable(True) for c in CONNECTION_COLUMNS]),
    "skip": SKIP_SCHEMA,
    "stray": STRAY_SCHEMA,
    "client": CLIENT_SCHEMA,
    "latency": SUMMARY_SCHEMA,
    "slow": LATENCY_SCHEMA,
    "sizes": pa.schema([pa.field("counted", pa.string()), pa.field("rows", pa.int64())]),
}
"""Each part's own columns, in the order its Spark reference gives them."""


def _union(what: str, schemas: list[pa.Schema]) -> list[pa.Field]:
    """Every column of ``schemas`` once, nullable (a name has one type in all of them)."""
    fields: dict[str, pa.Field] = {}
    for schema in schemas:
        for field in schema:
            known = fields.setdefault(field.name, field.with_nullable(True))
            if known.type != field.type:
                raise TypeError(f"{what}: {field.name} is {known.type} and {field.type}")
    return list(fields.values())


AUDIT_SCHEMA = pa.schema(
    [pa.field("part", pa.string(), nullable=False), *_union("audit table", list(PARTS.values()))]
)

TABLE_COLUMN = "table"
"""The column of :data:`AUDIT_AND_FACTS_SCHEMA` that says which table a row belongs to."""
AUDIT_AND_FACTS_SCHEMA = pa.schema(
    [
        pa.field(TABLE_COLUMN, pa.string(), nullable=False),
        *_union("audit and facts", [AUDIT_SCHEMA, FACTS_SCHEMA]),
    ]
)
"""The audit table and the facts in one table (``table`` = ``audit`` or ``facts``; each row
null in the other's columns): what the default audit reads, so that the capture is planned,
gathered and cached once for both."""


def _as_part(table: pa.Table, part: str) -> pa.Table:
    return _conform(table, AUDIT_SCHEMA, part=part)


def audit_and_facts(audit: pa.Table, facts: pa.Table) -> pa.Table:
    """The audit table (:data:`AUDIT_SCHEMA`) and the facts (:data:`FACTS_SCHEMA`) as one
    table of :data:`AUDIT_AND_FACTS_SCHEMA`."""
    return pa.concat_tables(
        [
            _conform(audit, AUDIT_AND_FACTS_SCHEMA, table="audit"),
            _conform(facts, AUDIT_AND_FACTS_SCHEMA, table="facts"),
        ]
    )


def audit_pass(table: pa.Table, window_s: float, slow_min_ms: float) -> pa.Table:
    """The audit table of ``table``: the rows of whole connections, as for
    :func:`connection_pass`."""
    if table.num_rows == 0:
        return AUDIT_SCHEMA.empty_table()
    transactions = connection_pass(table)
    kind = transactions.column("kind")
    connections = transactions.filter(pc.equal(kind, "connection"))
    lat = answered_requests(transactions)
    parts = {
        "connection": connections.select(list(CONNECTION_COLUMNS)),
        "skip": skipped_sends(transactions),
        "stray": stray_answers(transactions),
        "client": client_violations(transactions),
        "latency": summaries(lat, window_s),
        "slow": slow_candidates(lat, slow_min_ms),
    }
    parts["sizes"] = pa.table(
        {"counted": list(parts), "rows": [rows.num_rows for rows in parts.values()]}, schema=PARTS["sizes"]
    )
    return pa.concat_tables([_as_part(rows, part) for part, rows in parts.items()])
