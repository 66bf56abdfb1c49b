"""Reading Kafka bodies: the broker-side bodies as flat facts (for the body checks).

The per-connection pass (:mod:`spark_audit.connections`) decodes them a batch at a time
with :func:`decode_rows`, which reads the frames of the rows it is given where they are;
:func:`decode_facts` does the same over any capture DataFrame in one mapInArrow pass
(``_facts``). In each Arrow batch, Produce frames of the common shape are read all at once
with numpy (``_produce_vectorised``); every other frame is decoded one at a time
(``_frame_decode``): Produce requests walked by hand (``_produce_scalar``), everything else
with kafka-python. Both paths give the same facts.
"""

from __future__ import annotations

from ._facts import FACT_SCHEMA, FACT_SPARK_SCHEMA, broker_frames, decode_batches, decode_facts, decode_rows
from ._frame_decode import DECODED_KEYS, decode, errors

__all__ = [
    "DECODED_KEYS",
    "FACT_SCHEMA",
    "FACT_SPARK_SCHEMA",
    "broker_frames",
    "decode",
    "decode_batches",
    "decode_facts",
    "decode_rows",
    "errors",
]
