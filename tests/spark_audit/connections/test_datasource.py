"""The corrfix-transactions Data Source gathers whole connections from every file that holds
them, and gives what the shuffle path gives on the same rows."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from corrfix.capture.format import Source, schema_for
from spark_audit import AuditOptions, run_audit
from spark_audit.connections import (
    TABLE_COLUMN,
    TRANSACTIONS_SOURCE,
    TransactionsDataSource,
    facts_of,
    index_files,
    load_facts,
    load_transactions,
    transactions_of,
)
from spark_audit.source import list_files
from tests.support.audit_builders import ACKS0, ACKS1, CAPTURE, capture_df, repair, req, resp, row

CONNECTIONS = 6


def _connection(name: str, rng: random.Random) -> list[dict]:
    """A proxied connection: requests answered in order, some lost and re-sent, an acks=0."""
    rows, seq, uid = [row(name, 0, "open")], 1, 0
    for cid in range(rng.randint(3, 12)):
        api_key, frame = rng.choice([(0, ACKS1), (0, ACKS0), (3, None), (1, None)])
        extra = {"frame": frame, "api_version": 9} if frame else {}
        rows += [req(name, seq, "client", api_key, cid=cid, **extra)]
        rows += [req(name, seq + 1, "upstream", api_key, cid=cid, uid=uid, **extra)]
        seq += 2
        if frame is ACKS0:
            uid += 1
            continue
        if rng.random() < 0.2:  # lost answer, then a re-send
            rows += [repair(name, seq, "skip_detected", uid, cid, api_key=api_key)]
            rows += [req(name, seq + 1, "upstream", api_key, cid=cid, uid=uid + 1, **extra)]
            rows += [
                repair(
                    name, seq + 2, "requeue", uid, cid, api_key=api_key, new_upstream_correlation_id=uid + 1
                )
            ]
            seq, uid = seq + 3, uid + 1
        rows += [resp(name, seq, "upstream", api_key, cid=cid, uid=uid)]
        rows += [resp(name, seq + 1, "client", api_key, cid=cid, uid=uid)]
        seq, uid = seq + 2, uid + 1
    if rng.random() < 0.7:
        rows.append(row(name, seq, "close", reason="client closed"))
    return rows


@pytest.fixture(scope="module")
def rows():
    rng = random.Random(7)
    return [r for i in range(CONNECTIONS) for r in _connection(f"c{i}", rng)]


@pytest.fixture(scope="module")
def capture(tmp_path_factory, rows):
    """The rows spread over three files, every connection in several, mixed in every batch."""
    directory = tmp_path_factory.mktemp("spread")
    schema = schema_for(CAPTURE, Source.PROXY)
    ordered = sorted(rows, key=lambda r: (r["seq"], r["connection_id"]))
    third = len(ordered) // 3 + 1
    for n in range(3):
        path = directory / f"capture-20250101T000000.000000Z-{CAPTURE[:8]}-00000{n + 1}.arrows"
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            part = ordered[n * third : (n + 1) * third]
            for start in range(0, len(part), 5):
                writer.write_batch(pa.RecordBatch.from_pylist(part[start : start + 5], schema=schema))
    return directory


def test_the_index_counts_every_row_per_file_and_connection(capture, rows):
    index = index_files(list_files(str(capture)))
    assert len(index) == 3 and all(len(counts) > 1 for counts in index.values())
    totals: dict[str, int] = {}
    for counts in index.values():
        for key, n in counts.items():
            totals[key] = totals.get(key, 0) + n
    assert totals == {
        f"{CAPTURE}\x00c{i}": sum(r["connection_id"] == f"c{i}" for r in rows) for i in range(6)
    }


def _read(spark, capture, partitions, table, **options):
    spark.dataSource.register(TransactionsDataSource)
    reader = (
        spark.read.format(TRANSACTIONS_SOURCE)
        .option("partitions", str(partitions))
        .option("min_partition_rows", "1")
        .option("table", table)
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(str(capture))


@pytest.mark.parametrize("partitions", [1, 4])
@pytest.mark.parametrize("table", ["transactions", "facts"])
def test_the_data_source_gives_what_the_shuffle_gives(spark, capture, rows, partitions, table):
    df = _read(spark, capture, partitions, table)
    assert df.rdd.getNumPartitions() == partitions
    by_shuffle = transactions_of if table == "transactions" else facts_of
    expected = by_shuffle(capture_df(spark, rows))
    assert expected.count() > len(rows) // 10
    assertDataFrameEqual(df, expected)


@pytest.mark.parametrize("partitions", [1, 4])
def test_one_read_gives_the_audit_table_and_the_facts_as_their_own_reads(spark, capture, rows, partitions):
    both = _read(spark, capture, partitions, "audit_and_facts", sum_plain_sends="true")
    audit = _read(spark, capture, partitions, "audit")
    facts = _read(spark, capture, partitions, "facts", sum_plain_sends="true")
    assert audit.count() > CONNECTIONS and facts.filter(F.col("kind") == "batch_sends").count() > 0
    for name, table in (("audit", audit), ("facts", facts)):
        assertDataFrameEqual(both.filter(F.col(TABLE_COLUMN) == name).select(*table.columns), table)
    assert both.count() == audit.count() + facts.count()


@pytest.mark.parametrize("table", ["transactions", "audit_and_facts"])
def test_joining_batches_changes_no_row(spark, capture, table):
    """The writer's batches are read joined (``group_rows``) to save calls, not to change
    what they give: a batch at a time, a few joined, or a whole file give the same rows."""
    options = {"sum_plain_sends": "true"}
    alone = _read(spark, capture, 2, table, group_rows="1", **options)
    assert alone.count() > CONNECTIONS
    for group_rows in ("12", "1000000"):
        assertDataFrameEqual(_read(spark, capture, 2, table, group_rows=group_rows, **options), alone)


@pytest.mark.parametrize("load", [load_transactions, load_facts])
def test_the_job_loads_either_way(spark, capture, load):
    assertDataFrameEqual(load(spark, str(capture)), load(spark, str(capture), via="binaryfile"))


def test_the_audit_reports_the_same_either_way(spark, capture):
    """The fallback's one shuffle gives the audit table and the facts as the Data Source does
    (per partition rows differ: the report does not)."""
    reports = [
        run_audit(spark, AuditOptions(path=str(capture), via=via)) for via in ("datasource", "binaryfile")
    ]
    for report in reports:
        del report["elapsed_s"], report["options"]["via"]
    assert reports[0]["summary"]["findings"] > 0 and reports[0]["decode"]["facts"]
    assert reports[0] == reports[1]
