"""Whole connections, one pass each: the capture rows of each connection are gathered into
one partition (``_plan``, ``_datasource``) and reduced there, with numpy, to the
transactions the checks read (``_pass``: pairing by ``_matching``, acks by ``_acks``).

Spark cannot be told how a Python Data Source partitions its rows, but it does not need
to be: the pairing needs each frame next to its connection in Python, not in the JVM.
"""

from __future__ import annotations

from ._acks import produce_acks
from ._datasource import (
    FACTS_SPARK_SCHEMA,
    TRANSACTIONS_SOURCE,
    TRANSACTIONS_SPARK_SCHEMA,
    Connections,
    TransactionsDataSource,
)
from ._load import DRIVER_BYTES_CONF, facts_of, load_facts, load_transactions, transactions_of
from ._matching import INPUT_COLUMNS, PAIRS_SCHEMA, match
from ._pass import (
    FACT_COLUMNS,
    FACTS_SCHEMA,
    HEADER_COLUMNS,
    TRANSACTIONS_SCHEMA,
    connection_pass,
    facts_pass,
    merge_acks,
    with_acks,
)
from ._plan import Assignment, assign, index_files, summary_index

__all__ = [
    "DRIVER_BYTES_CONF",
    "FACTS_SCHEMA",
    "FACTS_SPARK_SCHEMA",
    "FACT_COLUMNS",
    "HEADER_COLUMNS",
    "INPUT_COLUMNS",
    "PAIRS_SCHEMA",
    "TRANSACTIONS_SCHEMA",
    "TRANSACTIONS_SOURCE",
    "TRANSACTIONS_SPARK_SCHEMA",
    "Assignment",
    "Connections",
    "TransactionsDataSource",
    "assign",
    "capture_gaps",
    "connection_pass",
    "facts_of",
    "facts_pass",
    "index_files",
    "load_facts",
    "load_transactions",
    "match",
    "merge_acks",
    "produce_acks",
    "summary_index",
    "transactions_of",
    "with_acks",
]
