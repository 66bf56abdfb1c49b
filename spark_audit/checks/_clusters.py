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
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

HOME = ["upstream_address", "cluster_id"]
"""What the pass knows of a connection's cluster (:mod:`spark_audit.connections._clusters`)."""
KEY = "cluster_key"
_CONNECTION = ["capture_id", "connection_id"]


def connection_homes(facts: DataFrame) -> DataFrame:
    """``capture_id, connection_id, upstream_address, cluster_id`` (the cluster its answers
    named) per connection: the facts' ``connection`` rows."""
    return facts.filter(F.col("fact") == "connection").select(*_CONNECTION, *HOME)


def resolve(rows: DataFrame, facts: DataFrame) -> DataFrame:
    """``rows``, which carry a connection's home (:data:`HOME`), with ``cluster_id`` its
    cluster as far as the audit can tell and :data:`KEY` (see the module)."""
    named = connection_homes(facts).filter(F.col("cluster_id").isNotNull())
    by_address = named.groupBy("upstream_address").agg(F.collect_set("cluster_id").alias("_named"))
    addresses = by_address.select(
        "upstream_address", F.when(F.size("_named") == 1, F.get("_named", 0)).alias("_address_cluster")
    )
    clusters = named.agg(F.collect_set("cluster_id").alias("_all")).select(
        (F.size("_all") <= 1).alias("_one"),
        F.get("_all", 0).alias("_only"),  # null when empty
    )
    joined = rows.join(F.broadcast(addresses), "upstream_address", "left").crossJoin(F.broadcast(clusters))
    cluster = F.coalesce(
        F.col("cluster_id"), F.col("_address_cluster"), F.when(F.col("_one"), F.col("_only"))
    )
    key = F.coalesce(cluster, F.when(~F.col("_one"), F.concat(F.lit("@"), "upstream_address")), F.lit(""))
    return (
        joined.withColumn("cluster_id", cluster)
        .withColumn(KEY, key)
        .drop("_address_cluster", "_one", "_only")
    )


def with_homes(rows: DataFrame, facts: DataFrame) -> DataFrame:
    """``rows`` of facts (of any connection) with their connection's home (:data:`HOME`), in
    place of any they had (null without a ``connection`` fact)."""
    return rows.drop(*HOME).join(F.broadcast(connection_homes(facts)), _CONNECTION, "left")


def by_connection(rows: DataFrame, facts: DataFrame) -> DataFrame:
    """``rows`` of facts (of any connection) with their connection's ``cluster_id`` and
    :data:`KEY` (:func:`resolve`)."""
    return resolve(with_homes(rows, facts), facts)
