"""The Produce request's layout, written once for every hand reader of it.

The proxy reads acks by hand (every Produce), and the audit walks Produce bodies by hand,
one frame at a time and a whole Arrow batch at a time. All of them follow these version
boundaries and this v2 record batch header; tests hold them against kafka-python's schemas.
"""

from __future__ import annotations

import struct

PRODUCE_FIRST_TRANSACTIONAL_ID = 3
"""The body starts with transactional_id (a nullable string) from this version."""
PRODUCE_FIRST_FLEXIBLE = 9
"""Compact strings, compact arrays and tagged fields from this version."""
PRODUCE_FIRST_TOPIC_ID = 13
"""Topics are named by a 16-byte topic id instead of a string from this version."""

RECORD_BATCH_HEADER = struct.Struct(">qiiBIhiqqqhii")
"""A v2 record batch header: base offset, batch length, partition leader epoch, magic, crc,
attributes, last offset delta, first and max timestamp, producer id, producer epoch, base
sequence, record count."""
RECORD_BATCH_HEADER_SIZE = RECORD_BATCH_HEADER.size
"""61 bytes: what a batch must hold for its producer id to be read."""
RECORD_BATCH_MAGIC_OFFSET = 16
"""The magic byte (2 for a v2 batch; 0 and 1 are the older message sets)."""
RECORD_BATCH_LOG_OVERHEAD = 12
"""The base offset and batch length: the bytes a batch's length does not count."""
NO_PRODUCER_ID = -1
"""The producer id of a batch from a producer that is not idempotent."""
