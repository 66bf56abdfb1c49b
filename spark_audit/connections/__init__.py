"""Whole connections, one pass each: the capture rows of each connection are gathered into
one partition (``_plan``, ``_datasource``) and reduced there, with numpy, to the
transactions the checks read (``_pass``: pairing by ``_matching``, acks by ``_acks``), and
further to the audit table (``_audit``): checks 1 and 2 per connection (``_anomalies``) and
latency summaries (``_latency``), so the default audit moves no row per request.

Spark cannot be told how a Python Data Source partitions its rows, but it does not need
to be: the pairing needs each frame next to its connection in Python, not in the JVM.
"""

from __future__ import annotations

from ._acks import produce_acks
from ._anomalies import (
    CLIENT_SCHEMA,
    END_OF_CAPTURE_REASONS,
    SKIP_SCHEMA,
    STRAY_SCHEMA,
    WRAP_DROP,
    client_violations,
    skipped_sends,
    stray_answers,
)
from ._audit import AUDIT_AND_FACTS_SCHEMA, AUDIT_SCHEMA, PARTS, TABLE_COLUMN, audit_and_facts, audit_pass
from ._batch_sends import BATCH_SENDS_SCHEMA, plain_batches, sum_sends
from ._clusters import HOME
from ._datasource import (
    FACTS_SPARK_SCHEMA,
    TRANSACTIONS_SOURCE,
    TRANSACTIONS_SPARK_SCHEMA,
    Connections,
    TransactionsDataSource,
)
from ._latency import (
    ACCURACY,
    LATENCY_SCHEMA,
    NS_PER_S,
    SUMMARY_SCHEMA,
    answered_requests,
    merge_summaries,
    slow_candidates,
    summaries,
)
from ._load import (
    DRIVER_BYTES_CONF,
    audit_of,
    facts_of,
    load_audit,
    load_audit_input,
    load_facts,
    load_transactions,
    transactions_of,
)
from ._matching import CONNECTION_CODE, INPUT_COLUMNS, PAIRS_SCHEMA, answers_in_order, match
from ._pass import (
    FACT_COLUMNS,
    FACTS_SCHEMA,
    HEADER_COLUMNS,
    TRANSACTIONS_SCHEMA,
    capture_gaps,
    connection_pass,
    facts_pass,
    merge_acks,
    with_acks,
)
from ._plan import Assignment, assign, index_files, summary_index

__all__ = [
    "ACCURACY",
    "AUDIT_AND_FACTS_SCHEMA",
    "AUDIT_SCHEMA",
    "BATCH_SENDS_SCHEMA",
    "CLIENT_SCHEMA",
    "CONNECTION_CODE",
    "DRIVER_BYTES_CONF",
    "END_OF_CAPTURE_REASONS",
    "FACTS_SCHEMA",
    "FACTS_SPARK_SCHEMA",
    "FACT_COLUMNS",
    "HEADER_COLUMNS",
    "HOME",
    "INPUT_COLUMNS",
    "LATENCY_SCHEMA",
    "NS_PER_S",
    "PAIRS_SCHEMA",
    "PARTS",
    "SKIP_SCHEMA",
    "STRAY_SCHEMA",
    "SUMMARY_SCHEMA",
    "TABLE_COLUMN",
    "TRANSACTIONS_SCHEMA",
    "TRANSACTIONS_SOURCE",
    "TRANSACTIONS_SPARK_SCHEMA",
    "WRAP_DROP",
    "Assignment",
    "Connections",
    "TransactionsDataSource",
    "answered_requests",
    "answers_in_order",
    "assign",
    "audit_and_facts",
    "audit_of",
    "audit_pass",
    "capture_gaps",
    "client_violations",
    "connection_pass",
    "facts_of",
    "facts_pass",
    "index_files",
    "load_audit",
    "load_audit_input",
    "load_facts",
    "load_transactions",
    "match",
    "merge_acks",
    "merge_summaries",
    "plain_batches",
    "produce_acks",
    "skipped_sends",
    "slow_candidates",
    "stray_answers",
    "sum_sends",
    "summaries",
    "summary_index",
    "transactions_of",
    "with_acks",
]
