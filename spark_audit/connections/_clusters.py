"""Each connection's Kafka cluster, as far as one partition can tell: its upstream address
(the broker's ``host:port`` on its ``open`` row) and the cluster its own answers named
(``cluster`` facts: Metadata v2+ and DescribeCluster answers). The pass folds both into one
``connection`` fact per connection, a few rows where the ``cluster`` facts were one per
Metadata answer; the checks that compare connections resolve the connections that named
no cluster by their address, across partitions, in Spark
(:mod:`spark_audit.checks._clusters`).

The sends of batches without a producer id are summed per batch and per *home*, the
connection's address and named cluster (:func:`send_homes`), so that two clusters' sends of
one batch stay two rows for Spark to keep apart.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_audit.connections._codes import NULL
from spark_audit.decode import FACT_SCHEMA

OPENS_SCHEMA = pa.schema(
    [
        pa.field("capture_id", pa.string()),
        pa.field("connection_id", pa.string()),
        pa.field("wall_ns", pa.int64()),
        pa.field("upstream_address", pa.string()),
    ]
)
"""An ``open`` row: which connection, when, and to which broker address."""
HOME = ("upstream_address", "cluster_id")
"""What the pass knows of a connection's cluster, on its ``connection`` fact and on each
summed batch's row."""
CONNECTION_FACT = "connection"
CLUSTER_FACT = "cluster"
_KEY = ("capture_id", "connection_id")


def open_rows(batch: pa.RecordBatch | pa.Table, among: np.ndarray | None = None) -> pa.Table:
    """The ``open`` rows of ``batch`` (of the rows ``among``, a mask, if given). The open row
    is ``seq`` 0: an integer test over the batch, then ``kind`` on those few rows."""
    first = pc.fill_null(pc.equal(batch.column("seq"), 0), False).to_numpy(zero_copy_only=False)
    if among is not None:
        first = first & among
    rows = np.flatnonzero(first)
    if len(rows) == 0:
        return OPENS_SCHEMA.empty_table()
    index = pa.array(rows)
    columns = {
        f.name: (
            batch.column(f.name).take(index).cast(f.type)
            if f.name in batch.schema.names
            else pa.nulls(len(rows), f.type)
        )
        for f in OPENS_SCHEMA
    }
    opens = pa.table(columns, schema=OPENS_SCHEMA)
    return opens.filter(pc.fill_null(pc.equal(batch.column("kind").take(index), "open"), False))


def connection_facts(facts: pa.Table, opens: pa.Table, seen: pa.Table) -> pa.Table:
    """One ``connection`` fact (:data:`FACT_SCHEMA` columns) per connection of ``opens`` or of
    ``seen`` (the ``capture_id`` and ``connection_id`` of every connection of ``facts``, in
    any number of rows each, such as the pass's counts per fact: no pass over the facts
    here): its ``upstream_address`` and the open row's ``wall_ns`` (null without an open
    row), and the ``cluster_id`` its answers named (null when they named none, or more than
    one)."""
    named = np.flatnonzero(pc.is_valid(facts.column("cluster_id")).to_numpy(zero_copy_only=False))
    clusters: dict[tuple[str, str], set[str]] = {}
    if len(named):
        found = facts.select([*_KEY, "cluster_id"]).take(pa.array(named))
        by = found.group_by(list(_KEY), use_threads=False).aggregate([("cluster_id", "distinct")])
        for capture, connection, names in zip(
            *(by.column(n).to_pylist() for n in by.column_names), strict=True
        ):
            clusters[(capture, connection)] = set(names)
    homes: dict[tuple[str, str], tuple[int | None, str | None]] = dict.fromkeys(
        zip(*(seen.column(n).to_pylist() for n in _KEY), strict=True), (None, None)
    )
    for capture, connection, wall_ns, address in zip(
        *(opens.column(n).to_pylist() for n in OPENS_SCHEMA.names), strict=True
    ):
        homes[(capture, connection)] = (wall_ns, address)
    rows = []
    for (capture, connection), (wall_ns, address) in homes.items():
        names = clusters.get((capture, connection), set())
        rows.append(
            {
                "capture_id": capture,
                "connection_id": connection,
                "seq": 0,
                "wall_ns": wall_ns,
                "fact": CONNECTION_FACT,
                "upstream_address": address,
                "cluster_id": next(iter(names)) if len(names) == 1 else None,
            }
        )
    schema = pa.schema([f.with_nullable(True) for f in FACT_SCHEMA])
    return pa.Table.from_pylist(rows, schema=schema)


def send_homes(sends: pa.Table, connections: pa.Table) -> tuple[pa.Array, pa.Array]:
    """Each send's connection's home (:data:`HOME`), as two dictionary arrays over the
    partition's few homes, so that summing per batch and home costs no hashing of strings
    per send. ``connections`` are :func:`connection_facts` rows, one per connection of the
    sends. A partition of one home (the usual case) is not looked at send by send."""
    codes: dict[tuple[str | None, str | None], int] = {}
    home_of: dict[tuple[str, str], int] = {}
    columns = (connections.column(n).to_pylist() for n in (*_KEY, *HOME))
    for capture, connection, address, cluster in zip(*columns, strict=True):
        home_of[(capture, connection)] = codes.setdefault((address, cluster), len(codes))
    at = _lookup(sends, home_of) if len(codes) > 1 else np.zeros(sends.num_rows, np.int32)
    homes = list(codes) or [(None, None)]
    indices = pa.array(at, pa.int32())
    address, cluster = (
        pa.DictionaryArray.from_arrays(indices, pa.array([home[i] for home in homes], pa.string()))
        for i in range(len(HOME))
    )
    return address, cluster


def _lookup(sends: pa.Table, home_of: dict[tuple[str, str], int]) -> np.ndarray:
    """Each send's home code, by its capture and connection ids' dictionary codes (one hash
    pass per column) and a table of the few (capture, connection) pairs."""
    encoded = [pc.dictionary_encode(sends.column(name).combine_chunks()) for name in _KEY]  # one dictionary
    captures, connections = (e.dictionary.to_pylist() for e in encoded)
    table = np.zeros((len(captures) + 1, len(connections) + 1), np.int32)  # row/column -1: a null id
    places = [{value: i for i, value in enumerate(values)} for values in (captures, connections)]
    for (capture, connection), code in home_of.items():
        if capture in places[0] and connection in places[1]:
            table[places[0][capture], places[1][connection]] = code
    indices = [pc.fill_null(e.indices, NULL).to_numpy(zero_copy_only=False).astype(np.int64) for e in encoded]
    return table[indices[0], indices[1]]
