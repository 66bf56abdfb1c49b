"""deploy/systemd: the unit passes ``systemd-analyze verify`` (which prints nothing for a clean
unit) and starts corrfix with options corrfix has, drained before systemd's SIGKILL."""

from __future__ import annotations

import configparser
import shlex
import subprocess
import sys

from corrfix._cli import DRAIN_TIMEOUT, build_parser
from tests.deploy.conftest import DEPLOY
from tests.support.tools import require_tool

UNIT = DEPLOY / "systemd" / "corrfix.service"


def verify(unit_text: str, tmp_path) -> str:
    systemd_analyze = require_tool(
        "systemd-analyze", "CORRFIX_REQUIRE_SYSTEMD_ANALYZE", "Debian: apt-get install systemd"
    )
    unit = tmp_path / UNIT.name
    unit.write_text(unit_text)
    result = subprocess.run(
        [systemd_analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    return result.stdout + result.stderr + ("" if result.returncode == 0 else f"rc={result.returncode}")


def with_this_corrfix(text: str) -> str:
    """verify checks that ExecStart's program exists: point it at this environment's corrfix."""
    return text.replace("/opt/corrfix/bin/corrfix", f"{sys.prefix}/bin/corrfix")


def test_systemd_analyze_verify_finds_nothing(tmp_path):
    assert verify(with_this_corrfix(UNIT.read_text()), tmp_path) == ""


def test_verify_would_report_a_mistake(tmp_path):
    broken = with_this_corrfix(UNIT.read_text()).replace("Type=notify", "Type=notfy")
    assert "Failed to parse service type" in verify(broken, tmp_path)


def service_section() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser["Service"]


def test_notify_type_reload_by_sighup_and_a_stop_timeout_beyond_the_drain():
    service = service_section()
    assert service["Type"] == "notify" and service["NotifyAccess"] == "main"
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert float(service["TimeoutStopSec"]) > DRAIN_TIMEOUT
    program, command, *options = shlex.split(service["ExecStart"])
    assert program.endswith("/corrfix") and command == "proxy"
    args = build_parser().parse_args([command, *options, "--listen", ":1", "--upstream", "h:2"])
    assert str(args.log_file) == "/var/log/corrfix/corrfix.log"  # in LogsDirectory=
    assert str(args.capture_dir).startswith("/var/lib/corrfix/")  # in StateDirectory=
