"""Settings from a TOML file: same names as the flags, flags win, typos are errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from corrfix._cli import _with_config_file, build_parser, proxy_config_from_args
from corrfix.core import Address

EXAMPLE = Path(__file__).parents[3] / "docs" / "mirrormaker-sidecar.toml"


def parse(*argv: str):
    parser = build_parser()
    return _with_config_file(parser, parser.parse_args(list(argv)), list(argv))


def test_the_documented_mirrormaker_example_is_valid():
    args = parse("proxy", "--config", str(EXAMPLE))
    config = proxy_config_from_args(args)
    assert config.listen == Address("127.0.0.1", 19092)
    assert config.broker_ports.fixed_port(3) == 19003
    assert config.repair.produce_policy == "requeue"
    assert args.metrics == Address("127.0.0.1", 9464) and args.log_json is True


def test_flags_override_the_file(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text('listen = "127.0.0.1:1"\nupstream = "h:2"\nprobe-after = 0.5\nbroker_port = ["7=9007"]\n')
    args = parse("proxy", "--config", str(file), "--probe-after", "0.25")
    config = proxy_config_from_args(args)
    assert config.repair.probe_after == 0.25
    assert config.upstream == Address("h", 2)
    assert config.broker_ports.fixed_port(7) == 9007


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('probe-aftr = 1\nlisten = "h:1"\nupstream = "h:2"', "unknown setting 'probe-aftr'"),
        ('listen = "nonsense"\nupstream = "h:2"', "HOST:PORT"),
        ('produce-policy = "sometimes"\nlisten = "h:1"\nupstream = "h:2"', "must be one of"),
        ('rewrite = "yes"\nlisten = "h:1"\nupstream = "h:2"', "true or false"),
        ("listen = [", "cannot read config"),
        ('listen = "h:1"\nupstream = ["h:2", "h:3"]', 'upstream must be a string: "HOST:PORT[,'),
        ('listen = ["h:1"]\nupstream = "h:2"', 'listen must be a string: "HOST:PORT"'),
    ],
)
def test_bad_files_are_clear_errors(tmp_path, capsys, text, message):
    file = tmp_path / "c.toml"
    file.write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        parse("proxy", "--config", str(file))
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_listen_and_upstream_are_still_required(capsys):
    with pytest.raises(SystemExit):
        parse("proxy", "--upstream", "h:1")
    assert "--listen is required" in capsys.readouterr().err


def test_an_unknown_key_names_the_nearest_valid_one(tmp_path, capsys):
    file = tmp_path / "c.toml"
    file.write_text('listen = "h:1"\nupstream = "h:2"\nmax_conections = 5\n')
    with pytest.raises(SystemExit):
        parse("proxy", "--config", str(file))
    assert "unknown setting 'max_conections' (did you mean 'max-connections'?)" in capsys.readouterr().err


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corrfix", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_config_accepts_the_documented_example_without_starting():
    result = check_config(EXAMPLE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{EXAMPLE}: valid (21 settings)"


def test_check_config_lists_every_error_with_a_suggestion(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text(
        '[proxy]\nlisten = "h:1"\nupstream = "h:2"\n'
        'probe-aftr = 1\nproduce-policy = "sometimes"\ncolour = "red"\n'
    )
    result = check_config(file)
    assert result.returncode == 1
    errors = result.stderr.strip().splitlines()
    assert errors == [
        f"{file}: unknown setting 'probe-aftr' (did you mean 'probe-after'?)",
        f"{file}: produce-policy must be one of ['disconnect', 'requeue']",
        f"{file}: unknown setting 'colour'",
    ]


def test_check_config_checks_what_only_starting_would_check(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text(f'listen = "h:1"\nupstream = "h:2"\ntls-cert = "{tmp_path / "missing.pem"}"\n')
    result = check_config(file)
    assert result.returncode == 1
    assert "--tls-cert" in result.stderr and "missing.pem" in result.stderr


def test_check_config_accepts_a_partial_file_and_says_what_must_come_from_elsewhere(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text("probe-after = 0.5\n")
    result = check_config(file)
    assert result.returncode == 0
    assert "--listen and --upstream to come from flags or CORRFIX_ variables" in result.stdout


def test_check_config_refuses_what_the_proxy_refuses_to_start_with(tmp_path, capsys):
    """``ready-interval = 30`` alone was valid to check-config, and the proxy refused to start."""
    file = tmp_path / "c.toml"
    file.write_text('listen = "h:1"\nupstream = "h:2"\nready-interval = 30\n')
    conflict = "--ready-stale (15 s) must be longer than --ready-interval (30 s)"
    with pytest.raises(SystemExit):
        parse("proxy", "--config", str(file))
    assert conflict in capsys.readouterr().err
    result = check_config(file)
    assert result.returncode == 1 and conflict in result.stderr


def test_check_config_refuses_a_list_where_the_flag_takes_a_string(tmp_path):
    """A TOML list of bootstrap brokers passed the file's checks unconverted, and check-config
    (and corrfix proxy) then failed with a traceback: --upstream takes them in one string."""
    file = tmp_path / "c.toml"
    file.write_text('listen = "h:1"\nupstream = ["h:2", "h:3"]\n')
    result = check_config(file)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f'{file}: upstream must be a string: "HOST:PORT[,HOST:PORT...]"'


def test_check_config_reports_an_unreadable_file(tmp_path):
    result = check_config(tmp_path / "absent.toml")
    assert result.returncode == 1 and "cannot read config" in result.stderr


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("ready-interval = 0", "ready-interval = 0: must be > 0"),
        ("capture-queue-rows = 0", "capture-queue-rows = 0: must be >= 1"),
        ("broker-port-base = 1.5", "broker-port-base = 1.5: expected a whole number, got '1.5'"),
        ("probe-after = -1", "probe-after = -1: expected a non-negative number of seconds"),
        ("max-connections = 0", "max-connections = 0: must be >= 1"),
    ],
)
def test_a_number_in_the_file_is_checked_as_the_flag_checks_it(tmp_path, setting, message):
    """Only text was checked, so a TOML number passed untouched what the flag refuses:
    ``ready-interval = 0`` ran the upstream checks in a loop at 100 % CPU, never ready."""
    file = tmp_path / "c.toml"
    file.write_text(f'listen = "h:1"\nupstream = "h:2"\n{setting}\n')
    result = check_config(file)
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert parse("proxy", "--config", str(EXAMPLE)).drain_timeout == 30.0  # numbers still read
