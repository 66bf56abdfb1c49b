"""The audit's command line: ``python -m spark_audit`` and ``corrfix audit`` share it."""

from __future__ import annotations

import argparse
import json
from collections import Counter

import pyarrow.compute as pc
import pyarrow.parquet as pq

from spark_audit import main, register_command


def test_writes_both_reports_and_fails_on_errors(spark, small_capture, tmp_path, capsys):
    out = tmp_path / "report"
    assert main([str(small_capture), "-o", str(out), "--check", "produce", "--fail-on", "error"]) == 1
    printed = capsys.readouterr()
    assert f"{out / 'report.html'}" in printed.out and "[audit" in printed.err
    report = json.loads((out / "report.json").read_text())
    assert list(report["checks"]) == ["produce"] and report["summary"]["by_severity"]["error"] == 1
    assert (out / "report.html").exists()


def test_fail_on_ignores_what_is_less_severe(spark, small_capture, tmp_path, capsys):
    argv = [str(small_capture), "-o", str(tmp_path), "--check", "upstream_ordering", "-q"]
    assert main([*argv, "--fail-on", "info"]) == 0
    assert capsys.readouterr().out == ""


def test_usage_errors_exit_2(spark, small_capture, tmp_path, capsys):
    assert main([str(tmp_path / "nothing"), "-o", str(tmp_path / "out"), "-q"]) == 2
    assert "no such capture" in capsys.readouterr().err
    assert main([str(small_capture), "-o", str(tmp_path / "out"), "--conf", "nonsense"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_register_command_wires_audit_into_a_cli():
    parser = argparse.ArgumentParser(prog="corrfix")
    audit = register_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["audit", "DIR", "-o", "OUT", "--fail-on", "warning", "--window", "5"])
    assert audit.prog.endswith("audit") and args.run.__name__ == "run"
    assert (args.path, str(args.output), args.fail_on, args.window) == ("DIR", "OUT", "warning", 5.0)


def test_tables_are_written_as_parquet_and_agree_with_the_report(spark, small_capture, tmp_path):
    tables = tmp_path / "tables"
    assert main([str(small_capture), "-o", str(tmp_path / "out"), "--tables", str(tables), "-q"]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    anomalies = pq.read_table(tables / "anomalies")
    assert anomalies.num_rows == report["summary"]["findings"]
    assert sorted(set(anomalies.column("check").to_pylist())) == sorted(
        name for name, check in report["checks"].items() if check["total"]
    )
    transactions = pq.read_table(tables / "transactions")
    client = transactions.filter(pc.equal(transactions.column("side"), "client"))
    timed = pc.and_(pc.is_valid(client.column("latency_ms")), client.column("expects"))
    answered = pc.sum(pc.fill_null(timed, False)).as_py()
    assert answered == sum(row["requests"] for row in report["latency"]["by_api"])
    facts = pq.read_table(tables / "facts")
    counted = Counter(facts.column("fact").to_pylist())
    assert counted.pop("connection") == sum(c["connections"] for c in report["captures"])  # one each
    decoded = report["decode"]["facts"]
    assert counted == {k: n for k, n in decoded.items() if k not in ("produce_ack", "cluster")}
