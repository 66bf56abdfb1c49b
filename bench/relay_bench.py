"""Relay and capture figures: echo-broker load through direct, haproxy, the bare Python relay
and corrfix variants.

Every case (frame size × connections × requests in flight) is run against every target in
the same invocation, the targets interleaved and rotated each repeat so that noise from a
shared machine falls on all of them alike. Figures are medians over repeats; ratios are
against haproxy and direct of the same run. The capture figure is corrfix with
``--capture-dir`` against corrfix without, on the same cases.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import loadgen
import procstat
import targets
from frames import produce_frame
from stats import median, percentile, ratio

KIB, MIB = 1024, 1024 * 1024


@dataclass(frozen=True)
class Case:
    size: int
    connections: int
    in_flight: int

    @property
    def key(self) -> str:
        size = f"{self.size // MIB} MiB" if self.size >= MIB else f"{self.size // KIB} KiB"
        size = size if self.size >= KIB else f"{self.size} B"
        return f"{size} x{self.connections} w{self.in_flight}"


FULL_CASES = [Case(s, c, w) for s in (100, 16 * KIB, MIB) for c in (1, 16) for w in (1, 5)]
QUICK_CASES = [Case(100, 1, 1), Case(100, 16, 5), Case(16 * KIB, 16, 1), Case(MIB, 16, 1)]
ALL_TARGETS = (
    "direct",
    "haproxy",
    "bare-python",
    "corrfix",
    "corrfix-w2",
    "corrfix-metrics",
    "corrfix-capture",
)


@dataclass(frozen=True)
class Timing:
    repeats: int
    seconds: float
    warmup: float


FULL_TIMING = Timing(repeats=3, seconds=1.5, warmup=0.4)
QUICK_TIMING = Timing(repeats=1, seconds=0.6, warmup=0.2)


def _one_run(target: targets.Target, request: bytes, case: Case, timing: Timing) -> dict[str, float]:
    window = procstat.CpuWindow(target.pid if target.name != "direct" else None)
    result = loadgen.run_load(
        ("127.0.0.1", target.port),
        request,
        case.connections,
        case.in_flight,
        timing.seconds,
        timing.warmup,
        window.mark,
    )
    cpu = window.seconds if window.pid is not None else float("nan")
    return {
        "rps": result.requests_per_second,
        "mbps": result.megabytes_per_second,
        "p50_us": percentile(result.latencies, 0.5) * 1e6,
        "p99_us": percentile(result.latencies, 0.99) * 1e6,
        "cpu_cores": cpu / result.seconds,
        "cpu_us_per_request": cpu / max(result.requests, 1) * 1e6,
        "rss_mib": window.rss / MIB if window.pid is not None else float("nan"),
    }


def _summarise(runs: list[dict[str, float]]) -> dict[str, float]:
    keys = runs[0].keys()
    summary = {k: round(median([r[k] for r in runs]), 1) for k in keys if k != "rss_mib"}
    summary["rss_mib"] = round(max(r["rss_mib"] for r in runs), 1)
    summary["runs"] = len(runs)
    return summary


def _capture_lost(directory: Path) -> dict[str, int]:
    """Rows written and lost, from the capture's JSON sidecars, and the bytes of its files."""
    written = lost = 0
    for sidecar in directory.glob("*.json"):
        with contextlib.suppress(ValueError, OSError):
            data = json.loads(sidecar.read_text())
            written += int(data.get("rows_written", 0))
            lost += int(data.get("rows_lost", 0))
    size = sum(file.stat().st_size for file in directory.rglob("*.arrows"))
    return {"rows_written": written, "rows_lost": lost, "bytes_written": size}


def _lost_since(directory: Path, before: int, entry: dict[str, object]) -> int:
    """Record in ``entry`` the capture rows lost since ``before``; returns the total now."""
    now = _capture_lost(directory)["rows_lost"] if directory.exists() else before
    entry["capture_rows_lost"] = now - before
    return now


def run_relay(
    work: Path, cases: list[Case], timing: Timing, wanted: tuple[str, ...] = ALL_TARGETS, log: object = print
) -> dict[str, object]:
    """Run every case against every wanted target; returns the figures as plain data."""
    skipped: dict[str, str] = {}
    if "haproxy" in wanted and targets.haproxy_binary() is None:
        skipped["haproxy"] = "haproxy is not installed (apt-get install haproxy): baseline skipped"
        log(f"  {skipped['haproxy']}")
        wanted = tuple(t for t in wanted if t != "haproxy")
    capture_dir = work / "relay-capture"
    results: list[dict[str, object]] = []
    with contextlib.ExitStack() as stack:
        echo = stack.enter_context(targets.echo_broker(work))
        running: dict[str, targets.Target] = {}
        for name in wanted:
            if name == "direct":
                running[name] = echo
            elif name == "haproxy":
                running[name] = stack.enter_context(targets.haproxy(echo.port, work))
            elif name == "bare-python":
                running[name] = stack.enter_context(targets.bare_relay(echo.port, work))
            elif name == "corrfix":
                running[name] = stack.enter_context(targets.corrfix(echo.port, work, name))
            elif name == "corrfix-w2":
                running[name] = stack.enter_context(targets.corrfix(echo.port, work, name, workers=2))
            elif name == "corrfix-metrics":  # as deployments run it: /metrics served
                extra = ["--metrics", "127.0.0.1:0"]
                running[name] = stack.enter_context(targets.corrfix(echo.port, work, name, extra=extra))
            elif name == "corrfix-capture":
                extra = ["--capture-dir", str(capture_dir)]
                running[name] = stack.enter_context(targets.corrfix(echo.port, work, name, extra=extra))
        order = list(running)
        # Rows the capture lost, per case: its summary as the case starts and as the next
        # one does (the writer rewrites the summary within a second of a change, and the
        # other targets' runs come between two cases' capture runs).
        lost_before = 0
        for case in cases:
            if "corrfix-capture" in running and results:
                lost_before = _lost_since(capture_dir, lost_before, results[-1])
            request = produce_frame(case.size)
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in order}
            for repeat in range(timing.repeats):
                rotated = order[repeat % len(order) :] + order[: repeat % len(order)]
                for name in rotated:
                    runs[name].append(_one_run(running[name], request, case, timing))
            summary = {name: _summarise(values) for name, values in runs.items()}
            entry: dict[str, object] = {
                "case": case.key,
                "size": case.size,
                "connections": case.connections,
                "in_flight": case.in_flight,
                "targets": summary,
            }
            if "haproxy" in summary:
                base = summary["haproxy"]["rps"]
                entry["vs_haproxy"] = {n: ratio(s["rps"], base) for n, s in summary.items()}
            if "direct" in summary:
                base = summary["direct"]["rps"]
                entry["vs_direct"] = {n: ratio(s["rps"], base) for n, s in summary.items()}
                p50 = summary["direct"]["p50_us"]
                entry["added_p50_us"] = {n: round(s["p50_us"] - p50, 1) for n, s in summary.items()}
            if "corrfix-capture" in summary and "corrfix" in summary:
                base = summary["corrfix"]["rps"]
                entry["capture_vs_off"] = ratio(summary["corrfix-capture"]["rps"], base)
            if "corrfix-metrics" in summary and "corrfix" in summary:
                entry["metrics_vs_off"] = ratio(summary["corrfix-metrics"]["rps"], summary["corrfix"]["rps"])
            results.append(entry)
            line = ", ".join(f"{n} {s['rps']:,.0f}/s p50 {s['p50_us']:,.0f}µs" for n, s in summary.items())
            log(f"  {case.key:>16}: {line}")
    report: dict[str, object] = {"cases": results, "skipped": skipped, "timing": timing.__dict__}
    if capture_dir.exists():
        if results:
            _lost_since(capture_dir, lost_before, results[-1])  # the proxy has stopped: final
        report["capture_rows"] = _capture_lost(capture_dir)
        shutil.rmtree(capture_dir, ignore_errors=True)
    return report
