"""Recovery benchmark: synchronous produces through a link that loses Produce answers.

Three runs of the same workload, each on a fresh Tansu, in one invocation:
  lossless   client -> Tansu
  lossy      client -> chaos relay (drops every Nth Produce answer) -> Tansu
  corrfix    client -> corrfix -> chaos relay -> Tansu
Figures are ratios against the lossless run of the same invocation. The goal (issue #6)
is corrfix ≤ 2.0x lossless; the lossy run shows what corrfix saves.

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
    parser.add_argument("--output", type=Path, help="JSON file (default: bench/results/recovery-<date>.json)")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.request_timeout_ms = 100, 5000
    work = Path(tempfile.mkdtemp(prefix="corrfix-bench-recovery-"))
    runs = {"lossless": (0, False), "corrfix": (args.drop_every, True)}
    if not args.skip_lossy:
        runs["lossy"] = (args.drop_every, False)
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    checks: dict[str, dict[str, int]] = {}
    for _ in range(args.repeats):
        for name, (drop_every, via_corrfix) in runs.items():
            result = sync_scene(
                workload,
                work,
                args.messages,
                name,
                drop_every=drop_every,
                via_corrfix=via_corrfix,
                timeout_ms=args.request_timeout_ms,
            )
            seconds[name].append(result.seconds)
            checks[name] = {"consumed": result.consumed, "duplicates": result.duplicates, **result.repairs}
            print(f"{name:>9}: {result.seconds:7.2f} s, consumed {result.consumed}", flush=True)
    base = statistics.median(seconds["lossless"])
    ratios = {name: statistics.median(values) / base for name, values in seconds.items()}
    report = {
        "benchmark": "recovery",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": f"{platform.machine()} {platform.processor() or ''} {platform.python_version()}".strip(),
        "messages": args.messages,
        "drop_every": args.drop_every,
        "request_timeout_ms": args.request_timeout_ms,
        "ratio_vs_lossless": {name: round(r, 2) for name, r in ratios.items()},
        "checks": checks,
        "goal": "corrfix <= 2.0x lossless",
    }
    out = args.output or RESULTS / f"recovery-{time.strftime('%Y-%m-%d')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["ratio_vs_lossless"]), f"-> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
