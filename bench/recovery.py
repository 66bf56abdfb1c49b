"""Recovery benchmark: synchronous produces through a link that loses Produce answers.

Four runs of the same workload, each on a fresh Tansu, in one invocation:
  lossless   client -> Tansu
  lossy      client -> chaos relay (drops every Nth Produce answer) -> Tansu
  corrfix    client -> corrfix -> chaos relay -> Tansu
  jitter     as corrfix, and the relay also holds a share of Produce answers (and those
             behind them) back for a few ms: latency that varies, with nothing lost to it
Figures are ratios against the lossless run of the same invocation. The goal (issue #15)
is corrfix ≤ 1.5x lossless with spurious probes ≤ 1 % of requests; the lossy run shows
what corrfix saves. A spurious probe is one that found no loss: probes sent less
probes that found a loss.

    python bench/recovery.py [--messages 600] [--drop-every 25] [--request-timeout-ms 30000] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

from corrfix.lab import sync_scene, workload

RESULTS = Path(__file__).parent / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=600)
    parser.add_argument("--drop-every", type=int, default=25)
    parser.add_argument("--request-timeout-ms", type=int, default=30_000, help="client default")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="100 messages, 5 s request timeout")
    parser.add_argument("--skip-lossy", action="store_true", help="skip the slow run without corrfix")
    parser.add_argument(
        "--jitter-probability", type=float, default=0.2, help="share of Produce answers held back (0: no run)"
    )
    parser.add_argument("--jitter-seconds", type=float, default=0.01, help="how long each is held back")
    parser.add_argument("--output", type=Path, help="JSON file (default: bench/results/recovery-<date>.json)")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.request_timeout_ms = 100, 5000
    work = Path(tempfile.mkdtemp(prefix="corrfix-bench-recovery-"))
    jitter = [
        "--delay-probability",
        str(args.jitter_probability),
        "--delay-seconds",
        str(args.jitter_seconds),
    ]
    jitter += ["--delay-in-order", "--seed", "25"]  # varying latency, never answers out of order
    runs: dict[str, tuple[int, bool, list[str]]] = {
        "lossless": (0, False, []),
        "corrfix": (args.drop_every, True, []),
    }
    if args.jitter_probability > 0:
        runs["jitter"] = (args.drop_every, True, jitter)
    if not args.skip_lossy:
        runs["lossy"] = (args.drop_every, False, [])
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    checks: dict[str, dict[str, int]] = {}
    for _ in range(args.repeats):
        for name, (drop_every, via_corrfix, faults) in runs.items():
            result = sync_scene(
                workload,
                work,
                args.messages,
                name,
                drop_every=drop_every,
                via_corrfix=via_corrfix,
                timeout_ms=args.request_timeout_ms,
                chaos_faults=faults,
            )
            seconds[name].append(result.seconds)
            checks[name] = {"consumed": result.consumed, "duplicates": result.duplicates, **result.repairs}
            spurious = result.repairs.get("probe_sent", 0) - result.repairs.get("probe_found_loss", 0)
            if via_corrfix:
                checks[name]["spurious_probes"] = spurious
            line = f"{name:>9}: {result.seconds:7.2f} s, consumed {result.consumed}"
            line += (
                f", spurious probes {spurious} ({100 * spurious / args.messages:.2f} %)"
                if via_corrfix
                else ""
            )
            print(line, flush=True)
    base = statistics.median(seconds["lossless"])
    ratios = {name: statistics.median(values) / base for name, values in seconds.items()}
    report = {
        "benchmark": "recovery",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": f"{platform.machine()} {platform.processor() or ''} {platform.python_version()}".strip(),
        "messages": args.messages,
        "drop_every": args.drop_every,
        "request_timeout_ms": args.request_timeout_ms,
        "jitter": {"probability": args.jitter_probability, "seconds": args.jitter_seconds},
        "ratio_vs_lossless": {name: round(r, 2) for name, r in ratios.items()},
        "spurious_probe_rate": {
            name: round(check["spurious_probes"] / args.messages, 4)
            for name, check in checks.items()
            if "spurious_probes" in check
        },
        "checks": checks,
        "goal": "corrfix <= 1.5x lossless; spurious probes <= 1 % of requests",
    }
    out = args.output or RESULTS / f"recovery-{time.strftime('%Y-%m-%d')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["ratio_vs_lossless"]), f"-> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
