"""Check 1, upstream ordering (proxy captures): answers that overtook older requests.

On the upstream side corrfix owns the ids and the broker must answer in order, so an
answer to a later send proves every older unanswered send's answer lost. For each such
skipped send this says what overtook it and what corrfix did about it, from its repair
rows: ``skip_detected``, ``requeue`` (and the new id), ``probe_found_loss``,
``possible_duplicate``, ``give_up``. Stray answers (to nothing, twice, or to acks=0) are
listed with whether corrfix dropped them.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from protocol import ApiKey
from spark_audit.checks._pairing import KEY, overtaken, requests, responses, side_pairs


def upstream_pairs(transactions: DataFrame) -> DataFrame:
    """Upstream pairs of proxy captures (wire captures have no upstream side): the pass
    keeps only the overtaken sends and the stray answers, all this check reads."""
    return side_pairs(transactions, "upstream")


def repair_summary(transactions: DataFrame) -> DataFrame:
    """Repair events per upstream id: ``events`` (sorted, distinct) and ``requeued_as``."""
    repairs = transactions.filter((F.col("kind") == "repair") & F.col("upstream_correlation_id").isNotNull())
    return repairs.groupBy(*KEY, F.col("upstream_correlation_id").alias("uid")).agg(
        F.sort_array(F.collect_set("event")).alias("events"),
        F.max("new_upstream_correlation_id").alias("requeued_as"),
    )


def _events(repairs: DataFrame, id_column: str, prefix: str) -> DataFrame:
    """Repair events keyed by ``id_column`` (so joins stay on column names)."""
    return repairs.select(
        *KEY,
        F.col("uid").alias(id_column),
        F.col("events").alias(f"{prefix}_events"),
        F.col("requeued_as").alias(f"{prefix}_requeued_as"),
    )


def upstream_skips(transactions: DataFrame, pairs: DataFrame | None = None) -> DataFrame:
    """One row per upstream send whose answer was overtaken, with what corrfix did
    (``pairs`` from :func:`upstream_pairs`, when the caller reuses them)."""
    pairs = pairs if pairs is not None else upstream_pairs(transactions)
    skipped = overtaken(requests(pairs)).filter("skipped")
    repairs = repair_summary(transactions)
    joined = (
        skipped.join(_events(repairs, "cid", "own"), [*KEY, "cid"], "left")
        .join(_events(repairs, "overtaken_cid", "by"), [*KEY, "overtaken_cid"], "left")
        .join(_events(repairs, "own_requeued_as", "new"), [*KEY, "own_requeued_as"], "left")
    )
    empty = F.array().cast("array<string>")
    actions = F.array_sort(
        F.array_union(
            F.coalesce(F.col("own_events"), empty),
            F.array_union(
                F.filter(F.coalesce(F.col("by_events"), empty), lambda e: e == "probe_found_loss"),
                F.filter(F.coalesce(F.col("new_events"), empty), lambda e: e == "possible_duplicate"),
            ),
        )
    )
    probe = (F.col("api_key") == ApiKey.API_VERSIONS) & F.col("client_correlation_id").isNull()
    by_probe = (F.col("overtaken_api_key") == ApiKey.API_VERSIONS) & F.col(
        "overtaken_client_correlation_id"
    ).isNull()
    outcome = (
        F.when(F.array_contains(actions, "requeue"), "requeued")
        .when(F.array_contains(actions, "give_up"), "gave_up")
        .when(probe, "probe_lost")
        .otherwise("unrepaired")
    )
    return joined.select(
        *KEY,
        "seq",
        F.col("overtaken_wall_ns").alias("wall_ns"),
        "api_key",
        "client_correlation_id",
        F.col("cid").alias("upstream_correlation_id"),
        probe.alias("probe"),
        F.col("overtaken_cid").alias("overtaken_by"),
        F.col("overtaken_api_key").alias("overtaken_by_api_key"),
        by_probe.alias("overtaken_by_probe"),
        F.col("answer_seq").isNotNull().alias("answered_late"),
        actions.alias("actions"),
        F.col("own_requeued_as").alias("requeued_as"),
        outcome.alias("outcome"),
    )


def upstream_strays(transactions: DataFrame, pairs: DataFrame | None = None) -> DataFrame:
    """Upstream answers that match no outstanding send: ``orphan``, ``duplicate`` or
    ``acks0_reply``; ``dropped`` says whether corrfix logged a stale_drop for the id."""
    pairs = pairs if pairs is not None else upstream_pairs(transactions)
    resp = responses(pairs)
    kind = (
        F.when(F.col("request_seq").isNull(), "orphan")
        .when(F.col("nth") > 1, "duplicate")
        .when(~F.col("request_expects"), "acks0_reply")
    )
    strays = resp.withColumn("kind", kind).filter(F.col("kind").isNotNull())
    drops = (
        transactions.filter((F.col("kind") == "repair") & (F.col("event") == "stale_drop"))
        .select(*KEY, F.col("upstream_correlation_id").alias("cid"), F.lit(True).alias("dropped"))
        .distinct()
    )
    joined = strays.join(drops, [*KEY, "cid"], "left")
    return joined.select(
        *KEY,
        "seq",
        "wall_ns",
        "api_key",
        F.col("cid").alias("upstream_correlation_id"),
        "client_correlation_id",
        "kind",
        F.coalesce(F.col("dropped"), F.lit(False)).alias("dropped"),
    )
