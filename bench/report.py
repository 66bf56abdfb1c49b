"""Turn a run's figures into the goals table and the Markdown results file.

The goals are issues #15's (relay, capture, recovery) and #16's (audit); they are measured
and reported here, never asserted.
"""

from __future__ import annotations

from typing import Any

CORRFIX_VARIANTS = ("corrfix", "corrfix-w2")


CEILING_WORDS = {
    "read": "a Python Data Source yielding the header columns from memory, summed",
    "window": "the same rows through one window over each connection in seq order",
    "python_pass": "the same rows through an identity mapInArrow",
}
"""What each of Spark's ceilings measures (bench/spark_ceiling.py)."""


def _ceiling_lines(ceilings: dict[str, int]) -> list[str]:
    """The audit section's lines on Spark's own ceilings, which run no corrfix code."""
    if not ceilings:
        return []
    lines = ["- Spark's own ceilings in the same session, no corrfix code, 1 M frames/s is the goal:"]
    for name, rate in ceilings.items():
        lines.append(f"  - {CEILING_WORDS.get(name, name)}: {rate:,} rows/s")
    return lines


def _case(relay: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    for case in (relay or {}).get("cases", []):
        if case["case"] == key:
            return case
    return None


def _fmt(value: float | None, unit: str = "×") -> str:
    if value is None:
        return "n/a"
    return f"{value:.2f}{unit}" if unit == "×" else f"{value:,.0f}{unit}"


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per goal: what was measured, the target, and whether it was met."""
    rows: list[dict[str, Any]] = []
    relay = results.get("relay")

    def vs_haproxy(key: str, label: str, target: float) -> None:
        case = _case(relay, key)
        for variant in CORRFIX_VARIANTS:
            value = (case or {}).get("vs_haproxy", {}).get(variant)
            rows.append(
                {
                    "goal": f"{label}, {variant}",
                    "target": f"≥ {target}× haproxy",
                    "measured": _fmt(value),
                    "met": None if value is None else value >= target,
                }
            )

    # issue #15's goals
    vs_haproxy("1 MiB x16 w1", "1 MiB × 16 req/s", 1.0)
    vs_haproxy("16 KiB x16 w1", "16 KiB × 16 req/s", 1.0)
    vs_haproxy("100 B x16 w5", "100 B × 16 × 5 in flight req/s", 0.6)

    def cpu_per_request(key: str, label: str, target: float) -> None:
        case = _case(relay, key)
        for variant in CORRFIX_VARIANTS:
            value = (case or {}).get("targets", {}).get(variant, {}).get("cpu_us_per_request")
            known = value is not None and value == value  # NaN when not sampled
            rows.append(
                {
                    "goal": f"{label}, {variant}",
                    "target": f"≤ {target:g} µs CPU per request",
                    "measured": _fmt(value if known else None, " µs"),
                    "met": value <= target if known else None,
                }
            )

    cpu_per_request("100 B x16 w5", "100 B × 16 × 5 in flight", 12)
    cpu_per_request("100 B x1 w1", "100 B × 1 × 1", 40)
    case = _case(relay, "100 B x1 w1")
    for variant in CORRFIX_VARIANTS:
        added = (case or {}).get("added_p50_us", {}).get(variant)
        rows.append(
            {
                "goal": f"added p50, 100 B × 1, 1 in flight, {variant}",
                "target": "≤ 80 µs over direct",
                "measured": _fmt(added, " µs"),
                "met": None if added is None else added <= 80,
            }
        )
    recovery = results.get("recovery", {})
    ratio = recovery.get("ratio_vs_lossless", {}).get("corrfix")
    messages = recovery.get("messages", 600)
    every = recovery.get("drop_every", 25)
    rows.append(
        {
            "goal": f"recovery: {messages} sync produces, 1 in {every} answers dropped",
            "target": "≤ 1.5× lossless",
            "measured": _fmt(ratio),
            "met": None if ratio is None else ratio <= 1.5,
        }
    )
    spurious = recovery.get("spurious_probe_rate", {})
    if spurious:
        worst_rate = max(spurious.values())
        rows.append(
            {
                "goal": "spurious probes, with and without jitter",
                "target": "≤ 1 % of requests",
                "measured": ", ".join(f"{name} {100 * rate:.2f} %" for name, rate in spurious.items()),
                "met": worst_rate <= 0.01,
            }
        )
    capture = [c.get("capture_vs_off") for c in (relay or {}).get("cases", []) if c.get("capture_vs_off")]
    if capture:
        worst = min(capture)
        rows.append(
            {
                "goal": "capture on vs off, worst relay case",
                "target": "≤ 15 % loss (≥ 0.85×)",
                "measured": f"{worst:.2f}× (median {sorted(capture)[len(capture) // 2]:.2f}×)",
                "met": worst >= 0.85,
            }
        )
    audit = results.get("audit", {})
    rate = audit.get("audit", {}).get("frames_per_s")
    below = audit.get("audit", {}).get("frames_per_s_below")
    ratio = audit.get("audit_vs_tshark")
    if rate is not None or below is not None:
        shown = _fmt(rate, " frames/s") if rate is not None else f"< {below:,} frames/s (timed out)"
        rows.append(
            {
                "goal": "audit throughput",
                "target": "≥ 1 M frames/s",
                "measured": shown,
                "met": (rate or below) >= 1_000_000 if rate is not None else False,
            }
        )
        ratio_below = audit.get("audit_vs_tshark_below")
        rows.append(
            {
                "goal": "audit vs tshark",
                "target": "≥ 30× tshark",
                "measured": _fmt(ratio) if ratio is not None else f"< {ratio_below}×",
                "met": ratio >= 30 if ratio is not None else (ratio_below or 0) >= 30 and None,
            }
        )
    measured = audit.get("audit", {})
    if "jvm_rows_per_frame" in measured:
        rows.append(
            {
                "goal": "audit rows into the JVM",
                "target": "≤ 0.6 per frame",
                "measured": f"{measured['jvm_rows_per_frame']:.3f}",
                "met": measured["jvm_rows_per_frame"] <= 0.6,
            }
        )
    if "demo_s_after_session_start" in measured:
        rows.append(
            {
                "goal": "audit of a demo-sized capture",
                "target": "≤ 5 s after the session starts",
                "measured": f"{measured['demo_s_after_session_start']} s ({measured['demo_rows']:,} rows)",
                "met": measured["demo_s_after_session_start"] <= 5,
            }
        )
    return rows


def _num(value: float, spec: str) -> str:
    """A figure, or a dash where there is none (direct has no proxy to measure)."""
    return "-" if value != value else format(value, spec)


def _mark(met: bool | None) -> str:
    return "n/a" if met is None else ("**met**" if met else "missed")


def markdown(results: dict[str, Any]) -> str:
    out: list[str] = []
    mode = "quick" if results.get("quick") else "full"
    out.append(f"# corrfix benchmarks, {results['date']} ({mode} run)\n")
    out.append(results.get("note", ""))
    machine = results["machine"]
    out.append("\n## Machine\n")
    out.append("| | |\n|---|---|")
    out.extend(f"| {k} | {v} |" for k, v in machine.items())
    out.append("\n## Goals (issues #15 and #16)\n")
    out.append("| goal | target | measured | |\n|---|---|---|---|")
    out.extend(
        f"| {g['goal']} | {g['target']} | {g['measured']} | {_mark(g['met'])} |" for g in goals(results)
    )
    relay = results.get("relay")
    if relay:
        out.append("\n## Relay (echo broker)\n")
        timing = relay["timing"]
        out.append(
            f"Medians of {timing['repeats']} runs of {timing['seconds']} s "
            f"(after {timing['warmup']} s warm-up). "
            "req/s and MB/s (request bytes; answers carry as many back); latency per request; "
            "proxy CPU in cores and µs per request; RSS of the proxy's processes.\n"
        )
        for key, why in relay.get("skipped", {}).items():
            out.append(f"- skipped {key}: {why}")
        out.append(
            "| case | target | req/s | MB/s | p50 µs | p99 µs | CPU cores | CPU µs/req | RSS MiB "
            "| vs haproxy | vs direct |\n|---|---|---|---|---|---|---|---|---|---|---|"
        )
        for case in relay["cases"]:
            for name, s in case["targets"].items():
                vh = case.get("vs_haproxy", {}).get(name)
                vd = case.get("vs_direct", {}).get(name)
                cpu, per_request, rss = s["cpu_cores"], s["cpu_us_per_request"], s["rss_mib"]
                out.append(
                    f"| {case['case']} | {name} | {s['rps']:,.0f} | {s['mbps']:,.1f} | {s['p50_us']:,.0f} "
                    f"| {s['p99_us']:,.0f} | {_num(cpu, '.2f')} | {_num(per_request, ',.0f')} "
                    f"| {_num(rss, '.0f')} | {_fmt(vh)} | {_fmt(vd)} |"
                )
        metered = [c for c in relay["cases"] if c.get("metrics_vs_off")]
        if metered:
            out.append("\n### Metrics\n")
            out.append(
                "`--metrics` on vs off (req/s of corrfix-metrics / corrfix), per case, with each one's "
                "CPU µs per request: deployments serve `/metrics`.\n"
            )
            out.append("| case | metrics on / off | CPU µs/req off | CPU µs/req on |\n|---|---|---|---|")
            for c in metered:
                off = c["targets"]["corrfix"]["cpu_us_per_request"]
                on = c["targets"]["corrfix-metrics"]["cpu_us_per_request"]
                shown = f"{_num(off, ',.1f')} | {_num(on, ',.1f')}"
                out.append(f"| {c['case']} | {_fmt(c['metrics_vs_off'])} | {shown} |")
        if relay.get("capture_rows"):
            rows = relay["capture_rows"]
            out.append("\n### Capture\n")
            out.append(
                f"Capture on vs off (req/s of corrfix-capture / corrfix), per case. Rows written "
                f"{rows['rows_written']:,}, rows lost (queue full) {rows['rows_lost']:,}"
                + (
                    f", {rows['bytes_written'] / 2**20:,.0f} MiB of files"
                    f" ({rows['bytes_written'] / max(rows['rows_written'], 1):,.0f} bytes per row).\n"
                    if "bytes_written" in rows
                    else ".\n"
                )
            )
            out.append("| case | capture on / off | rows lost |\n|---|---|---|")
            for c in relay["cases"]:
                lost = c.get("capture_rows_lost")
                shown = f"{lost:,}" if isinstance(lost, int) else "-"
                out.append(f"| {c['case']} | {_fmt(c.get('capture_vs_off'))} | {shown} |")
    tansu = results.get("tansu")
    if tansu:
        out.append("\n## Relay on Tansu (confluent-kafka producer)\n")
        out.append(f"{tansu['messages']:,} messages, {tansu['producer']}, median of {tansu['repeats']}.\n")
        out.append("| target | msg/s | vs direct | vs haproxy | proxy CPU µs/msg |\n|---|---|---|---|---|")
        for name in ("direct", "haproxy", "corrfix", "corrfix-w2"):
            if name in tansu:
                s = tansu[name]
                out.append(
                    f"| {name} | {s['msgs_per_s']:,} | {_fmt(s.get('vs_direct'))} "
                    f"| {_fmt(s.get('vs_haproxy'))} | {_num(s['cpu_us_per_msg'], '.2f')} |"
                )
    recovery = results.get("recovery")
    if recovery:
        out.append("\n## Recovery (bench/recovery.py)\n")
        out.append(
            f"{recovery.get('messages')} synchronous produces, every {recovery.get('drop_every')}th Produce "
            f"answer dropped, request timeout {recovery.get('request_timeout_ms')} ms.\n"
        )
        out.append("| run | time vs lossless |\n|---|---|")
        out.extend(f"| {k} | {_fmt(v)} |" for k, v in recovery.get("ratio_vs_lossless", {}).items())
        if recovery.get("error"):
            out.append(f"\nrecovery failed: {recovery['error']}")
    memory = results.get("memory")
    if memory:
        out.append("\n## Memory\n")
        out.append(
            f"{memory['idle_connections']:,} idle connections; {memory['slowloris_clients']} slowloris "
            "clients sending one byte a second of a 1 MiB request.\n"
        )
        out.append(
            "| proxy | RSS base MiB | RSS idle MiB | KiB per idle connection "
            "| RSS growth under slowloris MiB | slowloris clients still open |\n|---|---|---|---|---|---|"
        )
        for name in ("corrfix", "haproxy"):
            if name in memory:
                m = memory[name]
                out.append(
                    f"| {name} | {m['rss_base_mib']} | {m['rss_idle_mib']} | {m['idle_kib_per_connection']} "
                    f"| {m['rss_slowloris_growth_mib']} | {m['slowloris_still_open']} |"
                )
    audit = results.get("audit")
    if audit:
        out.append("\n## Audit\n")
        for key in ("skipped_audit", "skipped_tshark", "skipped_ceilings"):
            if key in audit:
                out.append(f"- {audit[key]}")
        if "tshark" in audit:
            t = audit["tshark"]
            out.append(
                f"- tshark: {t['frames']:,} frames (the base capture's pcapng export) in {t['seconds']} s: "
                f"{t['frames_per_s']:,} frames/s; fields {', '.join(t['fields'])}"
            )
        if "audit" in audit:
            a = audit["audit"]
            if "seconds" in a:
                out.append(
                    f"- corrfix audit: {a['frames']:,} frames in {a['seconds']} s (Spark session start, "
                    f"{a['session_start_s']} s, excluded): {a['frames_per_s']:,} frames/s"
                )
                if "runs_s" in a:
                    out.append(
                        f"- runs {a['runs_s']} s: best {a['frames_per_s']:,}, median "
                        f"{a['median_frames_per_s']:,} frames/s; {a['jvm_rows']:,} rows into the JVM "
                        f"({a['jvm_rows_per_frame']} per frame); planning {a['planning_s']} s; "
                        f"steps of the first run {a['steps_s']}"
                    )
                    out.append(
                        f"- a demo-sized capture ({a['demo_rows']:,} rows) audited "
                        f"{a['demo_s_after_session_start']} s after the session started (first Data Source "
                        f"use included)"
                    )
                if "floor_rows_per_s" in a:
                    out.append(
                        f"- floor: one read of the same capture's header columns through the same Data "
                        f"Source, summed and nothing else, in the same session (best of two runs after a "
                        f"warm one): {a['floor_seconds']} s, "
                        f"{a['floor_rows_per_s']:,} rows/s; the audit runs at "
                        f"{audit['audit_vs_floor']:.1%} of it"
                    )
                out.extend(_ceiling_lines(a.get("ceilings_rows_per_s", {})))
            else:
                out.append(
                    f"- corrfix audit: not finished with {a['frames']:,} frames within "
                    f"{a['timed_out_after_s']:.0f} s, so below {a['frames_per_s_below']:,} frames/s"
                )
        out.append(
            f"- capture written by corrfix's capture writer ({audit['base_frames']:,} frames) and its Arrow "
            f"batches copied ×{audit['copies']} with fresh connection ids"
        )
    for name, why in results.get("skipped", {}).items():
        out.append(f"\nSkipped {name}: {why}")
    return "\n".join(out) + "\n"
