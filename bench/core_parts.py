"""What each per-request step of the connection core costs alone, against the minimal core's
equivalent (issue #15): the steps the real core's common path takes that the minimal one in
engine_floor.py does not, timed with ``timeit`` (best of the repeats, ns per call).

A repairing core keeps a record per request (``_Request``, where the minimal core keeps a
tuple), reads the header's api key, version and body offset (``RequestHeaderReader.fields``,
where it unpacks one id), checks a Produce's acks, offers each answer to the cluster
router's rewrite, samples one latency per batch of answers and reads its next deadline once
per engine pass. Per request at N in flight, the per-frame steps count once and the
per-batch ones 1/N times.

    PYTHONPATH=<tree> python bench/core_parts.py [--number 200000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import struct
import timeit
from typing import Any

from frames import produce_frame

from corrfix.core import BrokerPorts, ClusterRouter, ConnectionConfig, ConnectionCore, RepairMachine
from corrfix.core import _repair as repair
from protocol import RequestHeaderReader, produce_acks_at

_ID = struct.Struct(">i")


RECORD = "(frame, key, version, client_id, body, 1.0, 5, 5)"


def steps() -> tuple[list[tuple[str, str, str]], dict[str, Any]]:
    """(step, how often, statement) for each step timed, and the names they use."""
    router = ClusterRouter("127.0.0.1", BrokerPorts(), lambda node, port: 1, set)
    machine = RepairMachine(
        transform=router.transform, local_answer=router.local_answer, flow_events=False, answer_events=False
    )
    core = ConnectionCore(ConnectionConfig(), machine, 0.0)
    frame = bytearray(produce_frame(100))
    fields = RequestHeaderReader().fields
    key, version, client_id, body = fields(frame)
    request = repair._Request(frame, key, version, client_id, body, 1.0, 5, 5)
    machine._client_order.append(request)  # one request owed: the deadline has a probe to read
    machine._send_order.append(request)
    machine._preamble = False
    answer = bytearray(48)
    router.transform(0, 7, answer)  # the router learns that this answer passes unchanged
    names: dict[str, Any] = {
        "Request": repair._Request,
        "frame": frame,
        "key": key,
        "version": version,
        "client_id": client_id,
        "body": body,
        "fields": fields,
        "unpack": _ID.unpack_from,
        "acks": produce_acks_at,
        "transform": router.transform,
        "answer": answer,
        "machine": machine,
        "request": request,
        "core": core,
    }
    return [
        ("request record (a tuple in the minimal core)", "frame", RECORD),
        ("request record (_Request)", "frame", f"Request{RECORD}"),
        ("one id unpacked (the minimal core's read)", "frame", "unpack(frame, 8)"),
        ("header fields (RequestHeaderReader.fields)", "frame", "fields(frame)"),
        ("a Produce's acks", "frame", "acks(frame, version, body)"),
        ("the router offered an answer", "answer", "transform(0, 7, answer)"),
        ("one latency sample", "batch", "machine._sample_latency(request, 1.0003)"),
        ("the next deadline (ConnectionCore)", "pass", "core.next_deadline()"),
    ], names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--number", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    timed, names = steps()
    for step, per, statement in timed:
        best = min(timeit.repeat(statement, globals=names, number=args.number, repeat=args.repeat))
        print(f"{step:48s} per {per:6s} {best / args.number * 1e9:6.0f} ns")


if __name__ == "__main__":
    main()
