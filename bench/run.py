"""Run the corrfix benchmarks (issues #15 and #16) and write bench/results/<date>.md and .json.

    python bench/run.py                  # everything (about 25 minutes on 2 cores)
    python bench/run.py --skip-lossy     # without recovery's 10-minute run without corrfix
    python bench/run.py --quick          # smoke test (about 2 minutes)
    python bench/run.py relay memory     # some scenarios only

Scenarios: relay (echo broker: direct, haproxy, corrfix, corrfix --workers 2),
tansu (confluent-kafka producer on Tansu), recovery (bench/recovery.py), capture
(corrfix with --capture-dir against without, on the relay cases), memory (idle
connections, slowloris), audit (corrfix audit against tshark). Every figure is a ratio
against a baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import audit_bench
import machine
import memory_bench
import relay_bench
import report
import tansu_bench

HERE = Path(__file__).parent
RESULTS = HERE / "results"
SCENARIOS = ("relay", "tansu", "recovery", "capture", "memory", "audit")
SHARED_NOTE = (
    "The machine was shared: other agents' test suites (JVMs, pytest) ran during this run, so "
    "absolute figures are noisy; each ratio compares targets measured interleaved in the same run."
)


def log(message: str) -> None:
    print(message, flush=True)


def run_recovery(quick: bool, work: Path, skip_lossy: bool) -> dict[str, object]:
    """bench/recovery.py as it is, in its own process; its JSON file is the result."""
    out = work / "recovery.json"
    command = [sys.executable, str(HERE / "recovery.py"), "--output", str(out)]
    command += ["--quick", "--skip-lossy"] if quick else (["--skip-lossy"] if skip_lossy else [])
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0 or not out.exists():
        return {"error": (done.stderr or done.stdout)[-2000:]}
    data = json.loads(out.read_text())
    log(f"  recovery: {data['ratio_vs_lossless']}")
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "scenarios", nargs="*", metavar="SCENARIO", help=f"any of {', '.join(SCENARIOS)} (default: all)"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke test: few cases, short runs")
    parser.add_argument("--repeats", type=int, help="relay repeats (default 3, quick 1)")
    parser.add_argument("--seconds", type=float, help="relay measuring window per run")
    parser.add_argument("--audit-frames", type=int, help="frames in the audit capture (default 5 M)")
    parser.add_argument("--audit-timeout", type=float, default=240.0, help="seconds the audit may take")
    parser.add_argument(
        "--skip-lossy", action="store_true", help="recovery without its slow run without corrfix (~10 min)"
    )
    parser.add_argument("--not-shared", action="store_true", help="leave out the shared-machine note")
    args = parser.parse_args()
    unknown = sorted(set(args.scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenarios {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    chosen = tuple(args.scenarios) or SCENARIOS
    quick = args.quick
    work = Path(tempfile.mkdtemp(prefix="corrfix-bench-"))
    results: dict[str, object] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": quick,
        "scenarios": list(chosen),
        "machine": machine.describe(),
        "note": "" if args.not_shared else SHARED_NOTE,
        "skipped": {},
    }
    started = time.monotonic()
    timing = relay_bench.QUICK_TIMING if quick else relay_bench.FULL_TIMING
    if args.repeats or args.seconds:
        timing = relay_bench.Timing(
            args.repeats or timing.repeats, args.seconds or timing.seconds, timing.warmup
        )

    def scenario(name: str, run: object) -> None:
        log(f"{name}:")
        begin = time.monotonic()
        try:
            results[name] = run()
        except Exception as exc:  # one failed scenario must not lose the others' figures
            traceback.print_exc()
            results["skipped"][name] = f"failed: {type(exc).__name__}: {exc}"
        log(f"  ({time.monotonic() - begin:.0f} s)")

    if "relay" in chosen or "capture" in chosen:
        wanted = relay_bench.ALL_TARGETS
        if "relay" not in chosen:
            wanted = ("corrfix", "corrfix-capture")
        elif "capture" not in chosen:
            wanted = tuple(t for t in wanted if t != "corrfix-capture")
        cases = relay_bench.QUICK_CASES if quick else relay_bench.FULL_CASES
        scenario("relay", lambda: relay_bench.run_relay(work, cases, timing, wanted, log))
    if "tansu" in chosen:
        # 100,000 messages took about 0.2 s per run: the producer's setup weighed on it and
        # the ratio moved by ±15 % between sittings, so each run now lasts about a second.
        messages, repeats = (100_000, 1) if quick else (500_000, 5)
        scenario("tansu", lambda: tansu_bench.run_tansu(work, messages, repeats, log))
    if "recovery" in chosen:
        scenario("recovery", lambda: run_recovery(quick, work, args.skip_lossy))
    if "memory" in chosen:
        idle, slow, seconds = (200, 10, 2.0) if quick else (1000, 50, 8.0)
        scenario("memory", lambda: memory_bench.run_memory(work, idle, slow, seconds, log))
    if "audit" in chosen:
        frames = args.audit_frames or (40_000 if quick else 5_000_000)
        base = min(frames, 20_000 if quick else 200_000)
        copies = -(-frames // base)
        timeout = min(args.audit_timeout, 90.0) if quick else args.audit_timeout  # ~25 s fixed cost
        scenario("audit", lambda: audit_bench.run_audit_bench(work, base, copies, timeout, log))
    results["machine"]["load_average_at_end"] = machine.load_average()
    results["seconds"] = round(time.monotonic() - started)
    results["goals"] = report.goals(results)
    RESULTS.mkdir(exist_ok=True)
    stem = time.strftime("%Y-%m-%d")
    if quick:
        stem += "-quick"
    elif set(chosen) != set(SCENARIOS):
        stem += "-" + "-".join(chosen)
    (RESULTS / f"{stem}.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (RESULTS / f"{stem}.md").write_text(report.markdown(results))
    log(f"wrote {RESULTS / stem}.md and .json in {results['seconds']} s")
    for goal in results["goals"]:
        log(f"  {goal['goal']}: {goal['measured']} (target {goal['target']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
