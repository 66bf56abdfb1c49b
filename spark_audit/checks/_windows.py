"""Fixed time windows on wall-clock nanoseconds (comparable across connections and captures)."""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from spark_audit.connections import NS_PER_S


def window_start(wall_ns: Column, window_s: float) -> Column:
    """Start (ns since the epoch) of the ``window_s``-second window holding ``wall_ns``."""
    size = int(window_s * NS_PER_S)
    return (F.floor(wall_ns / F.lit(size)) * F.lit(size)).cast("long")
