"""Fuzz bench: 10⁶ damaged frames, streams and hostile repair-machine runs, with failures reported.

Runs the targets of the fuzz tests (``protocol/testing/_fuzz.py``,
``corrfix/lab/_repair_fuzz.py``) far beyond the tests' budget. Each case gets its own
seed, so a failure prints a one-line reproducer:

    python bench/fuzz.py                      # 10^6 cases: 90 % wire layer, 10 % repair machine
    python bench/fuzz.py --cases 20000        # a quick run
    python bench/fuzz.py --replay protocol:1:123456
    python bench/fuzz.py --hypothesis 20000   # the same targets under hypothesis, with shrinking
    python bench/fuzz.py --atheris 200000     # coverage-guided, when atheris is installed

A case fails when a target raises anything but the documented ``protocol.ProtocolError``
where one is allowed, or when an invariant assertion fails. Exit status 1 if any failed.
Results go to ``bench/results/fuzz-<date>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from corrfix.lab import run_repair_case
from protocol.testing import (
    one_case,
    request_seeds,
    request_target,
    response_seeds,
    response_target,
    stream_target,
    varint_target,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CASE_SEED_STRIDE = 1 << 32
"""Case ``i`` of a run with seed ``s`` uses ``random.Random(s * stride + i)``."""


def protocol_case(rnd: random.Random) -> str:
    target, outcome = one_case(rnd)
    return f"{target}:{outcome}"


def repair_case(rnd: random.Random) -> str:
    harness = run_repair_case(rnd)
    if harness.rejected is not None:
        return "repair:rejected"
    return "repair:closed" if harness.closed is not None else "repair:settled"


KINDS: dict[str, Callable[[random.Random], str]] = {"protocol": protocol_case, "repair": repair_case}


def run_loop(cases: int, seed: int, repair_share: float, progress: float) -> dict:
    """The seeded loop; every case is independent and replayable."""
    request_seeds(), response_seeds()  # build the corpus outside the timing
    outcomes: Counter[str] = Counter()
    per_kind_seconds: Counter[str] = Counter()
    per_kind_cases: Counter[str] = Counter()
    failures: list[dict] = []
    chooser = random.Random(seed)
    started = last_report = time.perf_counter()
    for index in range(cases):
        kind = "repair" if chooser.random() < repair_share else "protocol"
        case_seed = seed * CASE_SEED_STRIDE + index
        began = time.perf_counter()
        try:
            outcomes[KINDS[kind](random.Random(case_seed))] += 1
        except Exception as exc:
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            failures.append(
                {
                    "replay": f"{kind}:{seed}:{index}",
                    "error": f"{type(exc).__name__}: {exc}"[:500],
                    "where": f"{Path(frame.filename).name}:{frame.lineno}",
                }
            )
            print(f"FAIL {kind} case {index}: {failures[-1]['error']} at {failures[-1]['where']}", flush=True)
        now = time.perf_counter()
        per_kind_seconds[kind] += now - began
        per_kind_cases[kind] += 1
        if progress and now - last_report >= progress:
            last_report = now
            print(
                f"  {index + 1:>9,} cases, {(index + 1) / (now - started):,.0f}/s, {len(failures)} failed",
                flush=True,
            )
    seconds = time.perf_counter() - started
    return {
        "cases": cases,
        "seconds": round(seconds, 2),
        "cases_per_second": round(cases / seconds),
        "per_kind": {
            kind: {
                "cases": per_kind_cases[kind],
                "cases_per_second": round(per_kind_cases[kind] / per_kind_seconds[kind])
                if per_kind_seconds[kind]
                else None,
            }
            for kind in KINDS
        },
        "outcomes": dict(sorted(outcomes.items())),
        "failures": failures,
    }


def replay(spec: str) -> int:
    """Re-run one case (``kind:seed:index``) and let its exception show in full."""
    kind, seed, index = spec.split(":")
    result = KINDS[kind](random.Random(int(seed) * CASE_SEED_STRIDE + int(index)))
    print(f"{spec}: passed ({result})")
    return 0


def run_hypothesis(examples: int) -> dict:
    """The same targets under hypothesis: guided generation, and a shrunk example on failure."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    config = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )

    @config
    @given(rnd=st.randoms(use_true_random=False))
    def protocol(rnd: random.Random) -> None:
        one_case(rnd)

    @config
    @given(rnd=st.randoms(use_true_random=False))
    def repair(rnd: random.Random) -> None:
        run_repair_case(rnd)

    report: dict = {}
    for name, test in (("protocol", protocol), ("repair", repair)):
        started = time.perf_counter()
        try:
            test()
            failure = None
        except Exception as exc:  # hypothesis re-raises the shrunk failure
            failure = f"{type(exc).__name__}: {exc}"[:2000]
            traceback.print_exc()
        seconds = time.perf_counter() - started
        report[name] = {"examples": examples, "seconds": round(seconds, 2), "failure": failure}
        print(f"hypothesis {name}: {examples:,} examples in {seconds:.1f} s, {'FAILED' if failure else 'ok'}")
    return report


def run_atheris(runs: int) -> None:
    """Coverage-guided fuzzing of the wire layer: atheris mutates raw bytes, guided by new edges.

    The first input byte picks the target and, for responses, the request the frame answers;
    the rest is the frame itself. Seeded with the kafka-python corpus.
    """
    try:
        import atheris
    except ImportError:
        print("atheris is not installed (pip install atheris): skipped")
        return
    import tempfile

    atheris.instrument_all()  # the targets are imported already: instrument their bytecode in place
    responses = response_seeds()
    corpus = Path(tempfile.mkdtemp(prefix="corrfix-atheris-"))
    for i, seed in enumerate(request_seeds()):
        (corpus / f"req{i}").write_bytes(b"\x00" + seed.frame)
    for i, seed in enumerate(responses):
        (corpus / f"resp{i}").write_bytes(bytes([1 + i % 250]) + seed.frame)

    def one_input(data: bytes) -> None:
        if not data:
            return
        selector, frame = data[0], data[1:]
        if selector == 0:
            request_target(frame)
        elif selector < 251:
            seed = responses[(selector - 1) % len(responses)]
            response_target(frame, seed.api_key, seed.api_version)
        elif selector < 254:
            stream_target(frame, random.Random(selector))
        else:
            varint_target(frame, selector - 254)

    print(f"atheris: {runs:,} inputs; corpus (seeds, then new finds) in {corpus}", flush=True)
    atheris.Setup([sys.argv[0], f"-runs={runs}", "-max_len=4096", str(corpus)], one_input)
    atheris.Fuzz()  # libFuzzer ends the process itself: exit 0 when done, non-zero on a crash


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repair-share", type=float, default=0.1, help="fraction of repair-machine cases")
    parser.add_argument(
        "--progress", type=float, default=30.0, help="seconds between progress lines (0: none)"
    )
    parser.add_argument("--replay", metavar="KIND:SEED:INDEX", help="re-run one failed case")
    parser.add_argument("--hypothesis", type=int, metavar="N", help="run N hypothesis examples per target")
    parser.add_argument("--atheris", type=int, metavar="N", help="run N coverage-guided atheris inputs")
    parser.add_argument(
        "--no-results", action="store_true", help="do not write bench/results/fuzz-<date>.json"
    )
    args = parser.parse_args()
    if args.replay:
        return replay(args.replay)
    if args.atheris:
        run_atheris(args.atheris)  # returns only when atheris is missing
        return 0
    if args.hypothesis:
        result = {"hypothesis": run_hypothesis(args.hypothesis)}
        failed = any(entry["failure"] for entry in result["hypothesis"].values())
    else:
        print(f"fuzzing {args.cases:,} cases (seed {args.seed}, {args.repair_share:.0%} repair machine)")
        loop = run_loop(args.cases, args.seed, args.repair_share, args.progress)
        result = {"loop": loop}
        failed = bool(loop["failures"])
        for kind, stats in loop["per_kind"].items():
            print(f"  {kind:>8}: {stats['cases']:>9,} cases, {stats['cases_per_second'] or 0:>7,}/s")
        rate = loop["cases_per_second"]
        print(f"  total   : {loop['cases']:>9,} cases in {loop['seconds']:.1f} s, {rate:,}/s")
        print(f"  outcomes: {loop['outcomes']}")
        print(f"  failures: {len(loop['failures'])}")
    if not args.no_results:
        RESULTS.mkdir(exist_ok=True)
        today = datetime.date.today().isoformat()
        out = RESULTS / f"fuzz-{today}.json"
        record = {
            "date": today,
            "machine": platform.platform(),
            "python": platform.python_version(),
            **result,
        }
        out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"results: {out.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
