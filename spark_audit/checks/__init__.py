"""The audit's checks: each a plain DataFrame transformation, testable on its own, in a
module named after the check (``_upstream_ordering``, ``_client_view``, ``_latency``,
``_storms``, ``_offsets``, ``_produce``).

The checks read the capture's transactions and facts (:mod:`spark_audit.connections`:
whole connections, paired and decoded in one Python pass before the JVM): the first three
take one side's pairs (``_pairing``) and the repair and close rows, the last three the
facts. They return result DataFrames; turning those into report findings is
:mod:`spark_audit.report`'s job.
"""

from __future__ import annotations

from ._client_view import client_pairs, client_view
from ._clusters import HOME, Clusters
from ._latency import latencies, latency_by_api, latency_by_window, slow_requests
from ._offsets import offset_losses
from ._produce import attempts, batch_sends, duplicate_batches, duplicates_of_sends, sequence_problems
from ._storms import CATEGORIES, GROUP_ACTIVITY, error_storms, isr_shrinks, leader_changes, rebalances
from ._upstream_ordering import upstream_pairs, upstream_skips, upstream_strays
from ._windows import window_start

__all__ = [
    "CATEGORIES",
    "GROUP_ACTIVITY",
    "HOME",
    "Clusters",
    "attempts",
    "batch_sends",
    "client_pairs",
    "client_view",
    "duplicate_batches",
    "duplicates_of_sends",
    "error_storms",
    "isr_shrinks",
    "latencies",
    "latency_by_api",
    "latency_by_window",
    "leader_changes",
    "offset_losses",
    "rebalances",
    "sequence_problems",
    "slow_requests",
    "upstream_pairs",
    "upstream_skips",
    "upstream_strays",
    "window_start",
]
