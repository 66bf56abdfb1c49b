"""The relay engine's floors: corrfix with a core that does nothing, and with the least a
repairing core does, against the real core, haproxy and the bare relay (issue #15).

``corrfix proxy`` runs here with its connection core replaced, in the child process only:

- ``noop``: every receive is forwarded as it came, copied once. No framing, no ids. What is
  left is the engine itself (its pass, its epoll bookkeeping, its sends) and the shell.
- ``minimal``: the least a repairing core must do, as the ninth round's throwaway did it:
  protocol's ``FrameDecoder`` both ways, an upstream id per request written into the frame,
  the request kept (a tuple, in a dict and a deque) until its answer, the client's id put
  back. No acks, no latency timer, no probes, no SASL, no preamble, no events, no rewriting.

Neither is a proxy (neither repairs anything; a connection that ends just ends), so they
live here, not in the product. Each case alternates the targets ``--rounds`` times in one
sitting and prints CPU µs per request from ``/proc`` (the whole process tree, as the relay
bench takes it), requests/s and p50; the figures go to ``bench/results/engine-floor-<date>.json``.

    python bench/engine_floor.py [--cases 100x1x1,100x16x5] [--rounds 3] [--seconds 3]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import struct
import sys
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
FLOORS = ("noop", "minimal")
_ID = struct.Struct(">i")
REQUEST_ID_AT = 8  # size, api key, api version, then the correlation id
ANSWER_ID_AT = 4  # size, then the correlation id


class NoopCore:
    """Forwards each receive as it came. Whatever the shell asks beyond the engine's calls
    (the close reason, say) is answered by the real core it was made from, never fed."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.client_decoder = real.client_decoder
        self.upstream_decoder = real.upstream_decoder
        self._to_upstream: list[bytearray] = []
        self._to_client: list[bytearray] = []
        self._events: list[object] = []
        self.decided = 0
        self.stop_client = self.stop_upstream = False
        self.upstream_spoke = self.abandon_client = self.end_upstream = self.end_client = False
        self.aborted = False
        self.discard_client_input = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def _end(self, *_args: object, **_kwargs: object) -> None:
        self.aborted = True
        self.decided += 1

    client_lost = upstream_lost = abort = drain = upstream_flushed = _end

    def tick(self, now: float) -> None:
        pass

    def pause_client(self) -> None:
        pass

    def resume_client(self, now: float) -> None:
        pass

    def client_read_allowed(self, upstream_backlog: int) -> bool:
        return True

    def upstream_read_allowed(self, client_backlog: int) -> bool:
        return True

    def next_deadline(self) -> float:
        return math.inf

    def take(self) -> tuple[list[bytearray], list[bytearray], list[object]]:
        out = self._to_upstream, self._to_client, self._events
        if out[0]:
            self._to_upstream = []
        if out[1]:
            self._to_client = []
        return out

    def receive_client(self, data: memoryview, now: float, filled: int = 0) -> None:
        if not data and not filled:
            self._end()
            return
        self._to_upstream.append(bytearray(data))

    def receive_upstream(self, data: memoryview, now: float, filled: int = 0) -> None:
        if not data and not filled:
            self._end()
            return
        self._to_client.append(bytearray(data))


class MinimalCore(NoopCore):
    """Frames both ways, an id of its own per request, the request kept until its answer."""

    def __init__(self, real: Any) -> None:
        super().__init__(real)
        self._next_id = 0
        self._sent: dict[int, tuple[int, bytearray, float]] = {}
        self._order: collections.deque[int] = collections.deque()

    def receive_client(self, data: memoryview, now: float, filled: int = 0) -> None:
        if not data and not filled:
            self._end()
            return
        sent, order, out = self._sent, self._order, self._to_upstream
        for frame in self.client_decoder.feed(data, filled):
            (client_id,) = _ID.unpack_from(frame, REQUEST_ID_AT)
            upstream_id = self._next_id
            self._next_id = (upstream_id + 1) & 0x7FFFFFFF
            _ID.pack_into(frame, REQUEST_ID_AT, upstream_id)
            sent[upstream_id] = (client_id, frame, now)
            order.append(upstream_id)
            out.append(frame)

    def receive_upstream(self, data: memoryview, now: float, filled: int = 0) -> None:
        if not data and not filled:
            self._end()
            return
        sent, order, out = self._sent, self._order, self._to_client
        for frame in self.upstream_decoder.feed(data, filled):
            (upstream_id,) = _ID.unpack_from(frame, ANSWER_ID_AT)
            client_id = sent.pop(upstream_id)[0]
            if order[0] == upstream_id:
                order.popleft()
            _ID.pack_into(frame, ANSWER_ID_AT, client_id)
            out.append(frame)


def serve(floor: str, args: list[str]) -> int:
    """The child: ``corrfix`` with every connection's core made as ``floor``'s."""
    from corrfix._main import main
    from corrfix.proxy import _connection

    kind = NoopCore if floor == "noop" else MinimalCore
    real = _connection.ConnectionCore
    _connection.ConnectionCore = lambda *a, **k: kind(real(*a, **k))  # type: ignore[assignment,misc]
    return main(args)


# -- the driver (its imports are the bench's, from this directory) --------------------------


@contextlib.contextmanager
def _floor_proxy(floor: str, upstream: int, work: Path) -> Iterator[Any]:
    """``corrfix proxy`` in front of ``upstream``, its cores made as ``floor``'s."""
    import targets

    port = targets.free_port()
    proxy = [*targets.proxy_arguments(port, upstream), "--log-json"]
    command = [sys.executable, __file__, "--serve", floor, "--", *proxy]
    with targets.Child(command, port, work / f"floor-{floor}.log") as child:
        assert child.proc is not None
        yield targets.Target(f"corrfix-{floor}", port, child.proc.pid)


def _targets(name: str, upstream: int, work: Path) -> AbstractContextManager[Any]:
    import targets

    if name == "haproxy":
        return targets.haproxy(upstream, work)
    if name == "bare-python":
        return targets.bare_relay(upstream, work)
    if name == "corrfix":
        return targets.corrfix(upstream, work, "corrfix")
    return _floor_proxy(name.removeprefix("corrfix-"), upstream, work)


def _one(target: Any, request: bytes, connections: int, in_flight: int, seconds: float) -> dict[str, float]:
    import loadgen
    import procstat
    from stats import percentile

    loadgen.run_load(("127.0.0.1", target.port), request, connections, in_flight, 0.5, 0.1)
    window = procstat.CpuWindow(target.pid)
    result = loadgen.run_load(
        ("127.0.0.1", target.port), request, connections, in_flight, seconds, 0.2, window.mark
    )
    return {
        "requests_per_second": round(result.requests_per_second),
        "cpu_us_per_request": round(window.seconds / max(result.requests, 1) * 1e6, 1),
        "p50_us": round(percentile(result.latencies, 0.5) * 1e6),
    }


def drive(cases: list[tuple[int, int, int]], rounds: int, seconds: float) -> dict[str, Any]:
    import targets
    from frames import produce_frame
    from stats import median

    names = ["haproxy", "bare-python", "corrfix-noop", "corrfix-minimal", "corrfix"]
    if targets.haproxy_binary() is None:
        names.remove("haproxy")
    report: dict[str, Any] = {"started": datetime.now(UTC).isoformat(timespec="seconds"), "cases": {}}
    with tempfile.TemporaryDirectory(prefix="floor") as tmp:
        work = Path(tmp)
        with targets.echo_broker(work) as echo:
            for size, connections, in_flight in cases:
                label = f"{size} B x {connections} x {in_flight}"
                runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
                for _ in range(rounds):
                    for name in names:
                        with _targets(name, echo.port, work) as target:
                            figures = _one(target, produce_frame(size), connections, in_flight, seconds)
                        runs[name].append(figures)
                        print(f"{label}  {name:16s} {figures}", flush=True)
                report["cases"][label] = {
                    name: {
                        "runs": got,
                        "median_cpu_us_per_request": median([r["cpu_us_per_request"] for r in got]),
                        "median_requests_per_second": median([r["requests_per_second"] for r in got]),
                    }
                    for name, got in runs.items()
                }
    return report


def _case(text: str) -> tuple[int, int, int]:
    size, connections, in_flight = (int(part) for part in text.split("x"))
    return size, connections, in_flight


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        floor, rest = sys.argv[2], sys.argv[3:]
        if floor not in FLOORS or rest[:1] != ["--"]:
            raise SystemExit(f"usage: engine_floor.py --serve {{{','.join(FLOORS)}}} -- CORRFIX-ARGS")
        return serve(floor, rest[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases", default="100x1x1,100x16x5", help="SIZExCONNECTIONSxIN-FLIGHT, comma-separated"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    report = drive([_case(text) for text in args.cases.split(",")], args.rounds, args.seconds)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"engine-floor-{datetime.now(UTC):%Y-%m-%d-%H%M}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    for label, by_target in report["cases"].items():
        print(label)
        for name, figures in by_target.items():
            print(
                f"  {name:16s} {figures['median_requests_per_second']:>9,} req/s"
                f"  {figures['median_cpu_us_per_request']:6.1f} µs per request (medians)"
            )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
