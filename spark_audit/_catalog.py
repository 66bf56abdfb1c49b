"""The names the audit's command line offers: its checks with their titles, the finding
severities, and the Data Source's name. Plain Python, importable without pyspark.
"""

from __future__ import annotations

DATA_SOURCE_NAME = "corrfix-capture"

CHECKS: dict[str, str] = {
    "upstream_ordering": "Upstream ordering: answers that overtook older requests, and what corrfix did",
    "client_view": "What the client saw: order, strays, acks=0 replies, unanswered requests, id order",
    "latency": "Latency per api key, and slow-request outliers",
    "storms": "Error storms: leader elections, rebalances, ISR shrinks, coordinator moves",
    "offsets": "Committed-offset loss",
    "produce": "Duplicate produce, and idempotent sequence gaps",
}
"""Every check by name, in report order, with the title the report gives it."""

SEVERITIES = ("info", "warning", "error")
"""Finding severities, least severe first: ``error`` (data lost or duplicated, or a client
shown something broken), ``warning`` (a fault that was repaired or may be harmless, an
outlier, a storm), ``info`` (worth knowing)."""


def severity_rank(severity: str) -> int:
    """Position in :data:`SEVERITIES`: higher is more severe."""
    return SEVERITIES.index(severity)
