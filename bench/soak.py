"""Chaos soak, bench mode: 100,000 messages per producer through corrfix and a lossy link.

The same run as ``tests/corrfix/test_soak.py`` (see ``corrfix/soak.py``), longer. It prints
the accounting and writes ``bench/results/soak-<date>.json``; the exit status is 1 when any
guarantee broke.

    python bench/soak.py                  # 100,000 messages per producer
    python bench/soak.py --messages 5000  # a quick look
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

import trio

from corrfix.lab import SoakPlan, run_soak

RESULTS = Path(__file__).parent / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=100_000, help="per producer (default 100000)")
    parser.add_argument("--kill-every", type=int, default=5_000, help="responses between upstream kills")
    parser.add_argument("--timeout", type=float, default=1_800.0, help="bound on the whole run, seconds")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--keep-capture", type=Path, help="leave the capture in this directory")
    args = parser.parse_args(argv)
    plan = SoakPlan(messages=args.messages, kill_every=args.kill_every, timeout=args.timeout, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="corrfix-soak-") as scratch:
        capture = args.keep_capture or Path(scratch)
        capture.mkdir(parents=True, exist_ok=True)
        outcome = trio.run(run_soak, plan, capture)
    summary = outcome.summary()
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"soak-{datetime.date.today().isoformat()}.json"
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"written to {out}")
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
