"""Import speed: ``corrfix capture import-pcap`` against tshark dissecting the same pcap.

The pcap is made once: corrfix's capture writer writes a synthetic proxy capture
(``synthetic_capture.py``: Produce v7 with a real record batch and its answers, 8
connections), and ``corrfix capture pcapng`` exports it. Each proxied connection becomes
two real-looking TCP connections (handshake, sequence and acknowledgement numbers,
segments of at most one IPv4 packet), every frame row one Kafka frame on the wire. The
default is 400,000 frames (76 MiB), so that the import's own work (about 0.5 s of CPU)
outweighs its start-up (about 0.35 s) and the noise of a shared machine. Two variants of
it are measured the same way (``midstream_pcap.py``): **midstream**, each TCP connection
without its first 101 packets (handshake included), as when tcpdump starts on a busy
broker; **lossy**, the same with one packet in 2,000 lost besides.

Then, for each pcap, interleaved, ``--rounds`` times each (median and best reported):

* **corrfix**: ``corrfix capture import-pcap PCAP -o DIR --kafka-port 9092`` in a child
  process, a fresh DIR each time;
* **tshark**: ``tshark -r PCAP -d tcp.port==9092,kafka -Y kafka -T fields -e ...`` with the
  fields an import reads (api key and version, correlation id, length, time), to a pipe.

Both are measured as whole commands, start-up included, by wall time and by CPU time
(user + system of the child, from ``os.wait4``). Rates are Kafka frames per second; the
ratio is corrfix's rate over tshark's. Each command's start-up is measured on a small pcap
(``--startup-frames``, 512: 32 frames per TCP connection, so that its connections take the
same path through the importer as the big pcap's and load the same modules; run in each
round) and taken off its CPU time for the dissection rates ("after start-up"): medians,
and best-of (the fastest run less the fastest start-up). The import alone, in this process
(``import_pcap`` timed with ``time.process_time`` after a first import has loaded every
module, ``--rounds`` times), is reported beside them.

    python bench/import_bench.py --rounds 9       # 400,000 frames, three pcaps
    python bench/import_bench.py --frames 10000 --rounds 1 --no-midstream
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import synthetic_capture
from midstream_pcap import write_midstream
from stats import median, ratio

from corrfix.capture.pcap import export_pcapng, import_pcap

HERE = Path(__file__).resolve().parent
PORT = 9092
LOSE_EVERY = 2000  # the lossy variant: one packet in this many lost, after a mid-stream start
TSHARK_FIELDS = (
    "frame.time_epoch",
    "kafka.len",
    "kafka.correlation_id",
    "kafka.api_key",
    "kafka.api_version",
)


def _child(command: list[str]) -> tuple[float, float, bytes]:
    """(wall seconds, CPU seconds, stdout) of one command run as a child process."""
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{command[0]} exited with {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime, output


def _corrfix(pcap: Path, out: Path) -> tuple[float, float, int]:
    command = [sys.executable, "-m", "corrfix", "capture", "import-pcap", str(pcap), "-o", str(out)]
    wall, cpu, output = _child([*command, "--kafka-port", str(PORT), "--json"])
    stats = json.loads(output)
    return wall, cpu, stats["requests"] + stats["responses"]


def _tshark(pcap: Path) -> tuple[float, float, int]:
    command = ["tshark", "-r", str(pcap), "-d", f"tcp.port=={PORT},kafka", "-Y", "kafka", "-T", "fields"]
    command += ["-E", "occurrence=a"] + [arg for field in TSHARK_FIELDS for arg in ("-e", field)]
    wall, cpu, output = _child(command)
    frames = sum(line.count(b",") + 1 for line in output.splitlines() if line.strip())
    return wall, cpu, frames


def make_pcap(directory: Path, frames: int) -> tuple[Path, int]:
    """The pcapng export of a synthetic capture of ``frames`` frame rows."""
    capture = directory / "capture"
    written = synthetic_capture.write_capture(capture, frames)
    pcap = directory / "traffic.pcapng"
    export_pcapng(capture, pcap, broker_port=PORT)
    return pcap, written


def run(
    frames: int, rounds: int, startup_frames: int = 512, midstream: bool = True, log: bool = True
) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="corrfix-import-bench-"))
    try:
        started = time.monotonic()
        pcap, written = make_pcap(work, frames)
        if log:
            size = pcap.stat().st_size
            made = time.monotonic() - started
            print(f"pcap: {written:,} frames, {size / 2**20:.1f} MiB, made in {made:.1f} s")
        tiny, _ = make_pcap(work / "tiny", startup_frames)
        report: dict[str, object] = {"frames": written, "rounds": rounds, "startup_frames": startup_frames}
        report.update(_measure(pcap, tiny, work / "clean", rounds, log))
        if midstream:
            for name, lose_every in (("midstream", 0), ("lossy", LOSE_EVERY)):
                cut = work / f"{name}.pcapng"
                write_midstream(pcap, cut, lose_every=lose_every)
                if log:
                    print(f"{name} variant: {cut.stat().st_size / 2**20:.1f} MiB")
                report[name] = _measure(cut, tiny, work / name, rounds, log)
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measure(pcap: Path, tiny: Path, work: Path, rounds: int, log: bool) -> dict[str, object]:
    """Both tools on ``pcap``: the import in-process, then whole commands interleaved."""
    import_pcap(tiny, work / "warm", [PORT])  # loads what the import loads on first use
    in_process = []
    for n in range(rounds):
        start = time.process_time()
        stats = import_pcap(pcap, work / f"in-process-{n}", [PORT])
        in_process.append(time.process_time() - start)
        shutil.rmtree(work / f"in-process-{n}")
    imported = stats.requests + stats.responses
    have_tshark = shutil.which("tshark") is not None
    startups: dict[str, list[float]] = {"corrfix": [], "tshark": []}
    runs: dict[str, list[tuple[float, float, int]]] = {"corrfix": [], "tshark": []}
    for n in range(rounds):  # interleaved, start-up runs among them: a busy spell hits both tools
        order = ["corrfix", "tshark"] if n % 2 == 0 else ["tshark", "corrfix"]
        for tool in order:
            if tool == "corrfix":
                startups[tool].append(_corrfix(tiny, work / f"tiny-out-{n}")[1])
                runs[tool].append(_corrfix(pcap, work / f"out-{n}"))
                shutil.rmtree(work / f"out-{n}")
            elif have_tshark:
                startups[tool].append(_tshark(tiny)[1])
                runs[tool].append(_tshark(pcap))
            if log and runs[tool]:
                wall, cpu, count = runs[tool][-1]
                print(
                    f"  {pcap.stem} round {n + 1} {tool}: {count:,} frames, {wall:.2f} s wall, "
                    f"{cpu:.2f} s CPU (start-up {startups[tool][-1]:.2f} s CPU)"
                )
    report: dict[str, object] = {
        "pcap_bytes": pcap.stat().st_size,
        "packets": stats.packets,
        "imported_frames": imported,
        "import_in_process": {
            "cpu_s": round(median(in_process), 3),
            "cpu_s_best": round(min(in_process), 3),
            "frames_per_cpu_s": round(imported / median(in_process)),
            "frames_per_cpu_s_best": round(imported / min(in_process)),
        },
    }
    for tool, measured in runs.items():
        if not measured:
            report[f"skipped_{tool}"] = f"{tool} is not installed"
            continue
        count = measured[0][2]
        cpu = median([m[1] for m in measured])
        best = min(m[1] for m in measured)
        fixed, fixed_best = median(startups[tool]), min(startups[tool])
        report[tool] = {
            "frames": count,
            "wall_s": round(median([m[0] for m in measured]), 3),
            "cpu_s": round(cpu, 3),
            "cpu_s_best": round(best, 3),
            "startup_cpu_s": round(fixed, 3),
            "startup_cpu_s_best": round(fixed_best, 3),
            "frames_per_s": round(count / median([m[0] for m in measured])),
            "frames_per_cpu_s": round(count / cpu),
            "frames_per_cpu_s_best": round(count / best),
            "frames_per_cpu_s_after_startup": round(count / max(cpu - fixed, 1e-3)),
            "frames_per_cpu_s_after_startup_best": round(count / max(best - fixed_best, 1e-3)),
        }
    if "corrfix" in report and "tshark" in report:
        ours, theirs = report["corrfix"], report["tshark"]
        assert isinstance(ours, dict) and isinstance(theirs, dict)
        report["vs_tshark_wall"] = ratio(ours["frames_per_s"], theirs["frames_per_s"])
        report["vs_tshark_cpu"] = ratio(ours["frames_per_cpu_s"], theirs["frames_per_cpu_s"])
        report["vs_tshark_cpu_best"] = ratio(ours["frames_per_cpu_s_best"], theirs["frames_per_cpu_s_best"])
        after = "frames_per_cpu_s_after_startup"
        report["vs_tshark_cpu_after_startup"] = ratio(ours[after], theirs[after])
        report["vs_tshark_cpu_after_startup_best"] = ratio(ours[after + "_best"], theirs[after + "_best"])
        report["in_process_vs_tshark_cpu_after_startup"] = ratio(imported / median(in_process), theirs[after])
        report["in_process_vs_tshark_cpu_after_startup_best"] = ratio(
            imported / min(in_process), theirs[after + "_best"]
        )
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--frames", type=int, default=400_000, help="Kafka frames in the pcap (default 400,000)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="runs of each tool, interleaved (default 3)")
    parser.add_argument(
        "--startup-frames",
        type=int,
        default=512,
        help="frames in the pcap start-up is measured on (default 512)",
    )
    parser.add_argument("--no-midstream", action="store_true", help="skip the mid-stream and lossy variants")
    parser.add_argument("--output", type=Path, help="JSON results (default bench/results/import-<date>.json)")
    args = parser.parse_args()
    report = run(args.frames, args.rounds, args.startup_frames, not args.no_midstream)
    report["date"] = datetime.now(UTC).isoformat(timespec="seconds")
    report["load_average"] = os.getloadavg()
    output = args.output or HERE / "results" / f"import-{datetime.now(UTC):%Y-%m-%d}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n")
    for name, part in [
        ("clean", report),
        ("midstream", report.get("midstream")),
        ("lossy", report.get("lossy")),
    ]:
        if isinstance(part, dict):
            print(name, json.dumps({k: v for k, v in part.items() if k.startswith(("vs_", "in_process"))}))
    print(f"written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
