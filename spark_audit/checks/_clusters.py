"""Which Kafka cluster each connection talks to, for the checks that compare connections
(committed offsets, produce sequences and duplicates): one audit of captures from two
clusters (a MirrorMaker's source and target, a client of both) must not take a group, a
topic or a producer id of one for the same-named one of the other.

The per-connection pass gives one ``connection`` fact per connection: its upstream address
(the broker's ``host:port``) and the cluster its own answers named (Metadata v2+,
DescribeCluster). A connection's cluster is, in this order:

1. the one cluster its own answers named;
2. else the one cluster that the connections to the same upstream address named (a group
   coordinator's connection doing only OffsetCommit and OffsetFetch, a partition leader's
   doing only Produce, take the cluster their broker named on another connection);
3. else, when the whole audit names at most one cluster, that one (or none): one cluster's
   connections are never split, whatever they named;
4. else none (``cluster_id`` null), and such connections are kept apart per upstream address
   (``cluster_key``): they could belong to either cluster, and taking them for one could
   give false findings. Connections of one unnamed broker stay together.

``cluster_key`` is what the checks group and join by (never null: the cluster id, ``@``
and the address of case 4, or empty), ``cluster_id`` what they report. A connection the
facts have no ``connection`` row for has no address and named nothing.

The rules need every connection of the audit, but only its few distinct homes (address
and cluster named): :class:`Clusters` resolves them on the driver, from rows the job's
first action collects anyway. An audit of one cluster, the usual case, then costs the
checks no join at all, and one of several a broadcast join with a local table of the homes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_audit.connections import HOME

KEY = "cluster_key"
_CONNECTION = ["capture_id", "connection_id"]


@dataclass(frozen=True)
class Clusters:
    """The clusters of an audit, resolved per home (upstream address, cluster named) by the
    module's rules: ``homes`` maps each to its ``cluster_id`` and :data:`KEY`; ``only`` is
    the one cluster of an audit that names at most one (None: none named), which needs no
    per-connection lookup at all (``single``)."""

    homes: dict[tuple[str | None, str | None], tuple[str | None, str]]
    single: bool
    only: str | None

    @classmethod
    def of_homes(cls, homes: Iterable[tuple[str | None, str | None]]) -> Clusters:
        """Resolve each distinct (upstream address, cluster named) pair seen."""
        seen = set(homes) | {(None, None)}  # a connection without a connection fact
        by_address: dict[str | None, set[str]] = {}
        for address, named in seen:
            if named is not None:
                by_address.setdefault(address, set()).add(named)
        every = {named for _, named in seen if named is not None}
        single = len(every) <= 1
        only = next(iter(every)) if len(every) == 1 else None
        resolved: dict[tuple[str | None, str | None], tuple[str | None, str]] = {}
        for address, named in seen:
            at_address = by_address.get(address, set())
            cluster = named or (next(iter(at_address)) if len(at_address) == 1 else None) or only
            if cluster is not None:
                key = cluster
            else:
                key = f"@{address}" if not single and address is not None else ""
            resolved[(address, named)] = (cluster, key)
        return cls(resolved, single, only)

    @classmethod
    def of(cls, facts: DataFrame) -> Clusters:
        """From the facts' ``connection`` rows (one Spark action; the job has them already)."""
        rows = connection_homes(facts).select(*HOME).distinct().collect()
        return cls.of_homes((row["upstream_address"], row["cluster_id"]) for row in rows)


def connection_homes(facts: DataFrame) -> DataFrame:
    """``capture_id, connection_id, upstream_address, cluster_id`` (the cluster its answers
    named) per connection: the facts' ``connection`` rows."""
    return facts.filter(F.col("fact") == "connection").select(*_CONNECTION, *HOME)


def resolve(rows: DataFrame, clusters: Clusters) -> DataFrame:
    """``rows``, which carry a connection's home (:data:`HOME`), with ``cluster_id`` its
    cluster as far as the audit can tell and :data:`KEY` (see the module)."""
    if clusters.single:
        return rows.withColumn("cluster_id", F.lit(clusters.only).cast("string")).withColumn(
            KEY, F.lit(clusters.only or "")
        )
    table = rows.sparkSession.createDataFrame(
        [(address, named, cluster, key) for (address, named), (cluster, key) in clusters.homes.items()],
        "_address string, _named string, _cluster string, _key string",
    )
    same = (F.col("upstream_address").eqNullSafe(F.col("_address"))) & F.col("cluster_id").eqNullSafe(
        F.col("_named")
    )
    joined = rows.join(F.broadcast(table), same, "left")
    return (
        joined.withColumn("cluster_id", F.col("_cluster"))
        .withColumn(KEY, F.coalesce(F.col("_key"), F.lit("")))
        .drop("_address", "_named", "_cluster", "_key")
    )


def with_homes(rows: DataFrame, facts: DataFrame, clusters: Clusters) -> DataFrame:
    """``rows`` of facts (of any connection) with their connection's home (:data:`HOME`), in
    place of any they had (null without a ``connection`` fact, and in an audit of one
    cluster, where the home decides nothing)."""
    rows = rows.drop(*HOME)
    if clusters.single:
        return rows.select("*", *(F.lit(None).cast("string").alias(name) for name in HOME))
    return rows.join(F.broadcast(connection_homes(facts)), _CONNECTION, "left")


def by_connection(rows: DataFrame, facts: DataFrame, clusters: Clusters) -> DataFrame:
    """``rows`` of facts (of any connection) with their connection's ``cluster_id`` and
    :data:`KEY` (:func:`resolve`)."""
    return resolve(with_homes(rows, facts, clusters), clusters)
