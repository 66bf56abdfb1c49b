"""Audit corrfix captures with Spark: ordering, what clients saw, latency, error storms,
committed-offset loss and duplicate produce, as report.json and report.html.

The job runs in stages, one room each: :mod:`spark_audit.source` reads captures,
:mod:`spark_audit.decode` reads bodies, :mod:`spark_audit.checks` finds what went wrong and
:mod:`spark_audit.report` writes it down; :func:`run_audit` runs them in order.

Importing this package does not import pyspark, so ``corrfix`` can offer the ``audit``
command without the ``audit`` extra installed; the command says what is missing. The job
and the session load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corrfix._lazy import lazy_exports

from ._catalog import CHECKS, DATA_SOURCE_NAME, SEVERITIES, severity_rank
from ._cli import INSTALL_HINT, add_arguments, main, register_command, run

if TYPE_CHECKING:
    from ._job import REPORT_FORMAT, REPORT_VERSION, AuditOptions, run_audit
    from ._progress import Progress
    from ._session import get_session

_LAZY = {
    "REPORT_FORMAT": "._job",
    "REPORT_VERSION": "._job",
    "AuditOptions": "._job",
    "run_audit": "._job",
    "Progress": "._progress",
    "get_session": "._session",
}

__all__ = [
    "CHECKS",
    "DATA_SOURCE_NAME",
    "INSTALL_HINT",
    "REPORT_FORMAT",
    "REPORT_VERSION",
    "SEVERITIES",
    "AuditOptions",
    "Progress",
    "add_arguments",
    "get_session",
    "main",
    "register_command",
    "run",
    "run_audit",
    "severity_rank",
]


__getattr__ = lazy_exports(__name__, _LAZY)
