"""Reading Kafka bodies: Produce ``acks`` from the frame head as Spark expressions (for the
header checks), and the broker-side bodies as a DataFrame of flat facts (for the body checks).

Facts come from one mapInArrow pass (``_facts``). In each Arrow batch, Produce frames of the
common shape are read all at once with numpy (``_produce_vectorised``); every other frame is
decoded one at a time (``_frame_decode``): Produce requests walked by hand
(``_produce_scalar``), everything else with kafka-python. Both paths give the same facts.
"""

from __future__ import annotations

from ._acks import expects_answer, with_acks, with_produce_acks
from ._facts import FACT_SCHEMA, FACT_SPARK_SCHEMA, broker_frames, decode_facts, load_bodies
from ._frame_decode import DECODED_KEYS, decode, errors

__all__ = [
    "DECODED_KEYS",
    "FACT_SCHEMA",
    "FACT_SPARK_SCHEMA",
    "broker_frames",
    "decode",
    "decode_facts",
    "errors",
    "expects_answer",
    "load_bodies",
    "with_acks",
    "with_produce_acks",
]
