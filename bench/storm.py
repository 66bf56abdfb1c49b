"""Many connections at once against a loaded proxy: the latency tail and how fast they are all taken.

The load generator opens ``--connections`` connections (default 400) one after another and
then keeps one 100 B request in flight on each; the first connections are relayed, and
loading the engine, while the proxy is still taking the others. Direct to the echo broker
and through haproxy (when installed) are the baselines of the same run. For corrfix, the
proxy's own log says when it opened each connection: the spread from the first to the last
is the time it took to take them all. Under load a plain lock between trio's thread and the
engine's thread starved trio's loop: p99.9 was seconds, and the last of 400 connections
was taken 6 s after the first (bench/README.md, "The engine's lock under load").

    python bench/storm.py [--connections 400] [--seconds 3] [--warmup 3] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from pathlib import Path

import loadgen
import targets
from frames import produce_frame
from stats import median, percentile

RESULTS = Path(__file__).parent / "results"


def _figures(result: loadgen.LoadResult) -> dict[str, float]:
    return {
        "requests_per_second": round(result.requests_per_second),
        **{
            f"{name}_ms": round(percentile(result.latencies, share) * 1e3, 2)
            for name, share in (("p50", 0.5), ("p99", 0.99), ("p99_9", 0.999), ("max", 1.0))
        },
    }


def _setup_spread(log: Path) -> float:
    """Seconds from the first to the last "connection opened" in corrfix's JSON log."""
    opened = [
        datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00"))
        for record in map(json.loads, log.read_text().splitlines())
        if record.get("event") == "connection opened"
    ]
    return round((max(opened) - min(opened)).total_seconds(), 3) if opened else float("nan")


Targets = Iterator[tuple[str, AbstractContextManager[targets.Target]]]


def _targets(echo: targets.Target, work: Path) -> Targets:
    yield "direct", nullcontext(echo)
    if targets.haproxy_binary() is not None:
        yield "haproxy", targets.haproxy(echo.port, work)
    yield "corrfix", targets.corrfix(echo.port, work, "corrfix")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    request = produce_frame(100)
    runs: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="storm") as tmp:
        work = Path(tmp)
        with targets.echo_broker(work) as echo:
            for _ in range(args.repeats):
                for name, target in _targets(echo, work):
                    with target as t:
                        result = loadgen.run_load(
                            ("127.0.0.1", t.port), request, args.connections, 1, args.seconds, args.warmup
                        )
                    figures = _figures(result)
                    if name == "corrfix":
                        figures["all_connections_taken_within_s"] = _setup_spread(work / "corrfix.log")
                    runs.setdefault(name, []).append(figures)
                    print(name, figures, flush=True)
    summary = {
        name: {key: median([run[key] for run in results]) for key in results[0]}
        for name, results in runs.items()
    }
    out = RESULTS / f"storm-{datetime.now().date()}.json"
    out.write_text(json.dumps({"connections": args.connections, "runs": runs, "medians": summary}, indent=2))
    print("medians:", json.dumps(summary, indent=2))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
