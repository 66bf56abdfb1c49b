"""Audit figure: frames/s of ``corrfix audit`` against tshark dissecting the same traffic.

1. corrfix's capture writer writes a base capture (``base_frames`` frame rows, see
   :mod:`synthetic_capture`).
2. The base file's Arrow batches are copied ``copies`` times with fresh connection ids
   (pyarrow, no re-encoding), giving a capture of at least 5 M frames in full mode.
3. The audit runs on the whole capture in its own process; only ``run_audit`` is timed,
   after the Spark session has started.
4. ``corrfix capture pcapng`` exports the base capture; tshark dissects it with the Kafka
   fields the audit reads (time, length, api key and version, correlation id, error code,
   base offset). tshark's rate is taken on the base capture only: both it and the export
   run at a few thousand frames a second here, so 5 M frames would take the best part of
   an hour; its rate is per frame, so the ratio still compares like with like.
5. In the audit's session, after it: the floor, one summed read of the capture's header
   columns through the same Data Source (:mod:`audit_job`), and Spark's own ceilings on
   this machine, which run no corrfix code (:mod:`spark_ceiling`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import synthetic_capture
from audit_job import AUDIT_RUNS

from corrfix.capture import SUMMARY_SUFFIX, read_summaries, write_summary

HERE = Path(__file__).parent
BROKER_PORT = 9092
SESSION_ALLOWANCE = 90.0
"""Seconds allowed for the Spark session to start, on top of the audit's own budget."""
TSHARK_FIELDS = (
    "frame.time_epoch",
    "kafka.len",
    "kafka.request_key",
    "kafka.api_version",
    "kafka.correlation_id",
    "kafka.response_key",
    "kafka.error",
    "kafka.offset",
)


def _replicate(directory: Path, copies: int) -> int:
    """Add ``copies - 1`` copies of every capture file, each with its own connection ids,
    and enter them in the capture's summary as the capture writer would have (files, rows
    per connection per file), so that the audit plans from the summary as it does for a
    real capture rather than reading every copy's ``connection_id`` column."""
    sources = sorted(directory.glob("*.arrows"))
    [summary_path] = directory.glob(f"*{SUMMARY_SUFFIX}")
    [summary] = read_summaries(summary_path)
    rows = 0
    for source in sources:
        with ipc.open_stream(pa.memory_map(str(source))) as reader:
            table = reader.read_all()
        rows += table.num_rows * copies
        index = table.schema.get_field_index("connection_id")
        for copy in range(1, copies):
            ids = pc.binary_join_element_wise(table.column(index), pa.scalar(f"x{copy}"), "-")
            copied = table.set_column(
                index, table.schema.field(index), ids.cast(table.schema.field(index).type)
            )
            target = source.with_name(source.name.replace(".arrows", f"-copy{copy:03d}.arrows"))
            with pa.OSFile(str(target), "wb") as sink, ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(copied, max_chunksize=65536)
            counts = summary.connections.get(source.name, {})
            summary.connections[target.name] = {f"{conn}-x{copy}": n for conn, n in counts.items()}
            summary.files.append(target.name)
            summary.rows_written += table.num_rows
    write_summary(summary_path, summary)
    return rows


def _tshark(pcapng: Path) -> tuple[float, int]:
    command = ["tshark", "-r", str(pcapng), "-d", f"tcp.port=={BROKER_PORT},kafka", "-Y", "kafka"]
    command += ["-T", "fields", "-E", "occurrence=f"]
    for field in TSHARK_FIELDS:
        command += ["-e", field]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        raise RuntimeError(f"tshark failed: {done.stderr[-1000:]}")
    return seconds, done.stdout.count("\n")


DEMO_FRAMES = 1_192
"""With the open and close rows of its 8 connections, about the 1,203 rows of the demo's capture."""


def _run_audit_job(capture: Path, demo: Path, timeout: float, allowance: float) -> dict[str, object]:
    """The audit job's JSON line; on timeout its whole process group (the JVM too) is killed.

    ``allowance``: seconds for the Spark session to start, on top of the audit's own budget
    (``timeout`` per timed run)."""
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "audit_job.py"), str(capture), str(demo)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=AUDIT_RUNS * timeout + 2 * allowance)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"timeout": True}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"error": err[-2000:] or "no output"}
    if "seconds" in result and result["seconds"] > timeout:
        return {"timeout": True}
    return result


def run_audit_bench(
    work: Path, base_frames: int, copies: int, timeout: float, log: object = print
) -> dict[str, object]:
    """``timeout``: seconds the audit itself may take; slower is reported as a bound."""
    report: dict[str, object] = {"base_frames": base_frames, "copies": copies}
    capture = work / "audit-capture"
    shutil.rmtree(capture, ignore_errors=True)
    try:
        start = time.monotonic()
        written = synthetic_capture.write_capture(capture, base_frames)
        report["capture_write_s"] = round(time.monotonic() - start, 1)
        pcapng = work / "audit-base.pcapng"
        start = time.monotonic()
        export = [sys.executable, "-m", "corrfix", "capture", "pcapng", str(capture), "-o", str(pcapng)]
        subprocess.run([*export, "--broker-port", str(BROKER_PORT)], check=True, capture_output=True)
        report["pcapng_export_s"] = round(time.monotonic() - start, 1)
        if shutil.which("tshark"):
            seconds, lines = _tshark(pcapng)
            report["tshark"] = {
                "frames": lines,
                "seconds": round(seconds, 2),
                "frames_per_s": round(lines / seconds),
                "fields": list(TSHARK_FIELDS),
            }
            log(f"  tshark: {lines:,} frames in {seconds:.1f} s ({lines / seconds:,.0f} frames/s)")
        else:
            report["skipped_tshark"] = "tshark is not installed (apt-get install tshark)"
        pcapng.unlink(missing_ok=True)
        rows = _replicate(capture, copies)
        frames = written * copies
        report["frames"] = frames
        report["rows"] = rows
        demo = work / "audit-demo-capture"
        shutil.rmtree(demo, ignore_errors=True)
        synthetic_capture.write_capture(demo, DEMO_FRAMES)
        result = _run_audit_job(capture, demo, timeout, min(SESSION_ALLOWANCE, 2 * timeout))
        if "timeout" in result:
            report["audit"] = {
                "frames": frames,
                "timed_out_after_s": timeout,
                "frames_per_s_below": round(frames / timeout),
            }
            log(
                f"  audit: not done with {frames:,} frames after {timeout:.0f} s "
                f"(< {frames / timeout:,.0f} frames/s)"
            )
            if "tshark" in report:
                report["audit_vs_tshark_below"] = round(
                    frames / timeout / report["tshark"]["frames_per_s"], 2
                )
            return report
        if "error" in result:
            report["skipped_audit"] = f"corrfix audit could not run: {result['error']}"
            log(f"  {report['skipped_audit']}")
            return report
        audit_rate = frames / result["seconds"]
        median_rate = frames / result["median_s"]
        report["audit"] = {
            "frames": frames,
            "seconds": round(result["seconds"], 2),
            "runs_s": result["runs_s"],
            "frames_per_s": round(audit_rate),
            "median_frames_per_s": round(median_rate),
            "jvm_rows": result["jvm_rows"],
            "jvm_rows_per_frame": round(result["jvm_rows"] / frames, 3),
            "planning_s": result["planning_s"],
            "steps_s": result["steps_s"],
            "demo_rows": DEMO_FRAMES + 16,
            "demo_s_after_session_start": round(result["demo_s"], 2),
            "session_start_s": round(result["session_start_s"], 1),
            "findings": result.get("findings"),
            "counts": result.get("counts"),
        }
        log(
            f"  audit: {frames:,} frames, best {result['seconds']:.2f} s ({audit_rate:,.0f} frames/s), "
            f"median {result['median_s']:.2f} s ({median_rate:,.0f} frames/s); "
            f"{result['jvm_rows'] / frames:.3f} JVM rows per frame; "
            f"demo-sized capture {result['demo_s']:.1f} s after the session started"
        )
        if "ceilings_error" in result:
            report["skipped_ceilings"] = f"the floor or Spark's ceilings failed: {result['ceilings_error']}"
            log(f"  {report['skipped_ceilings']}")
        else:
            floor_rate = round(result["floor_rows"] / result["floor_seconds"])
            report["audit"]["floor_seconds"] = round(result["floor_seconds"], 2)
            report["audit"]["floor_rows_per_s"] = floor_rate
            report["audit"]["ceilings_rows_per_s"] = {
                name: round(rate) for name, rate in result["ceilings_rows_per_s"].items()
            }
            report["audit_vs_floor"] = round(audit_rate / floor_rate, 3)
            log(f"  floor: one summed read of the header columns, {floor_rate:,} rows/s")
            for name, rate in report["audit"]["ceilings_rows_per_s"].items():
                log(f"  Spark ceiling, {name}: {rate:,} rows/s")
        if "tshark" in report:
            report["audit_vs_tshark"] = round(audit_rate / report["tshark"]["frames_per_s"], 1)
        return report
    finally:
        shutil.rmtree(capture, ignore_errors=True)
        shutil.rmtree(work / "audit-demo-capture", ignore_errors=True)
