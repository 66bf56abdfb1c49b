"""Settings from CORRFIX_ variables: every long option has one; flag > env > file > default."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib

import pytest

from corrfix import _cli as cli
from corrfix._cli import _with_config_file, build_parser, proxy_config_from_args
from corrfix.core import Address
from corrfix.proxy._config_env import env_name, env_variables, long_option
from corrfix.proxy._config_file import settable_actions


def parse(*argv: str, env: dict[str, str] | None = None):
    parser = build_parser()
    return _with_config_file(parser, parser.parse_args(list(argv)), list(argv), env or {})


def proxy_parser() -> argparse.ArgumentParser:
    return build_parser()._proxy_parser


def test_every_long_option_of_the_proxy_has_a_variable():
    variables = env_variables(proxy_parser())
    options = {long_option(action) for action in settable_actions(proxy_parser()).values()}
    assert {env_name(option) for option in options} == set(variables)
    for expected in (
        "CORRFIX_LISTEN",
        "CORRFIX_UPSTREAM",
        "CORRFIX_PROBE_AFTER",
        "CORRFIX_NO_CLIENT_COMPAT",
        "CORRFIX_BROKER_PORT",
        "CORRFIX_CAPTURE_DIR",
        "CORRFIX_UPSTREAM_NO_CHECK_HOSTNAME",
        "CORRFIX_LOG_JSON",
        "CORRFIX_METRICS",
        "CORRFIX_DRAIN_TIMEOUT",
    ):
        assert expected in variables
    assert "CORRFIX_HELP" not in variables and "CORRFIX_REUSE_PORT" not in variables


def test_variables_give_every_kind_of_setting():
    env = {
        "CORRFIX_LISTEN": "127.0.0.1:1",
        "CORRFIX_UPSTREAM": "broker:9092",
        "CORRFIX_PROBE_AFTER": "0.5",
        "CORRFIX_MAX_REQUEUES": "7",
        "CORRFIX_PRODUCE_POLICY": "disconnect",
        "CORRFIX_NO_CLIENT_COMPAT": "yes",
        "CORRFIX_BROKER_PORT": "1=9001, 2=9002",
        "CORRFIX_LOG_JSON": "on",
        "CORRFIX_CAPTURE_QUEUE_BYTES": "1M",
    }
    args = parse("proxy", env=env)
    config = proxy_config_from_args(args)
    assert config.listen == Address("127.0.0.1", 1) and config.upstream == Address("broker", 9092)
    assert config.repair.probe_after == 0.5 and config.repair.max_requeues == 7
    assert config.repair.produce_policy == "disconnect"
    assert config.repair.client_compat is False
    assert config.broker_ports.fixed_port(2) == 9002
    assert args.log_json is True and args.capture_queue_bytes == 1024 * 1024
    assert args.setting_sources["probe_after"] == "env CORRFIX_PROBE_AFTER"
    assert args.setting_sources["max_held_bytes"] == "default"


def test_a_false_switch_variable_leaves_the_switch_off():
    args = parse("proxy", env={"CORRFIX_LISTEN": ":1", "CORRFIX_UPSTREAM": "h:2", "CORRFIX_NO_REWRITE": "0"})
    assert args.rewrite is True


def test_flag_beats_variable_beats_file_beats_default(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text(
        'listen = "127.0.0.1:1"\nupstream = "h:2"\nprobe-after = 0.5\nprobe-min = 0.05\nmax-requeues = 9\n'
    )
    env = {"CORRFIX_CONFIG": str(file), "CORRFIX_PROBE_AFTER": "0.25", "CORRFIX_PROBE_MIN": "0.01"}
    args = parse("proxy", "--probe-after", "0.125", env=env)
    assert args.probe_after == 0.125  # flag over variable and file
    assert args.probe_min == 0.01  # variable over file
    assert args.max_requeues == 9  # file over default
    assert args.request_deadline == 300  # default
    sources = args.setting_sources
    assert sources["probe_after"] == "flag --probe-after"
    assert sources["probe_min"] == "env CORRFIX_PROBE_MIN"
    assert sources["max_requeues"] == f"file {file}"
    assert sources["request_deadline"] == "default"


def test_a_repeatable_flag_replaces_the_variable_s_list_and_the_file_s(tmp_path):
    """``--broker-port`` given as a flag was appended to ``CORRFIX_BROKER_PORT``'s (or the
    file's) list, which ``--print-config`` then said came from the flag."""
    file = tmp_path / "c.toml"
    file.write_text('listen = "127.0.0.1:1"\nupstream = "h:2"\nbroker-port = ["1=9001"]\n')
    given = ("proxy", "--config", str(file), "--broker-port", "3=9003")
    for env in ({"CORRFIX_BROKER_PORT": "1=9001,2=9002"}, {}):
        args = parse(*given, env=env)
        assert args.broker_port == [(3, 9003)]
        assert args.setting_sources["broker_port"] == "flag --broker-port"
    assert parse("proxy", "--config", str(file)).broker_port == [(1, 9001)]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CORRFIX_PROBE_AFTER": "soon"}, "CORRFIX_PROBE_AFTER = 'soon'"),
        ({"CORRFIX_LOG_JSON": "maybe"}, "CORRFIX_LOG_JSON='maybe': expected 1, true"),
        ({"CORRFIX_PRODUCE_POLICY": "sometimes"}, "CORRFIX_PRODUCE_POLICY must be one of"),
        ({"CORRFIX_LISTEN": "nonsense"}, "HOST:PORT"),
    ],
)
def test_a_bad_variable_is_a_clear_error(capsys, env, message):
    with pytest.raises(SystemExit) as exit_info:
        parse("proxy", "--listen", ":1", "--upstream", "h:2", env=env)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_ready_stale_not_longer_than_the_ready_interval_is_refused(capsys):
    """``CORRFIX_READY_INTERVAL=30`` with the default ``--ready-stale 15``: each answer went
    stale 15 s before the next check, and /readyz failed half the time with a healthy broker."""
    given = ("proxy", "--listen", ":1", "--upstream", "h:2")
    with pytest.raises(SystemExit) as exit_info:
        parse(*given, env={"CORRFIX_READY_INTERVAL": "30"})
    assert exit_info.value.code == 2
    assert "--ready-stale (15 s) must be longer than --ready-interval (30 s)" in capsys.readouterr().err
    assert parse(*given, "--ready-stale", "45", env={"CORRFIX_READY_INTERVAL": "30"}).ready_stale == 45


@pytest.mark.parametrize(
    ("ports", "message"),
    [
        (("--broker-port", "1=19092"), "--broker-port 1=19092 is the --listen port"),
        (("--broker-port", "1=19001", "--broker-port", "2=19001"), "--broker-port 1=19001 and 2=19001 share"),
        (("--broker-port", "1=19001", "--broker-port", "1=19002"), "gives node 1 two ports, 19001 and 19002"),
    ],
)
def test_broker_ports_that_would_share_a_listener_are_refused_at_start(capsys, ports, message):
    """With --workers (SO_REUSEPORT) both binds succeed and the kernel splits one broker's
    connections with the other listener, which relays them elsewhere; without, the first
    answer naming the broker closes its connection. Either way only at run time."""
    with pytest.raises(SystemExit) as exit_info:
        parse("proxy", "--listen", "127.0.0.1:19092", "--upstream", "h:2", *ports)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_capture_limit_below_one_file_is_refused(capsys):
    """The file being written is never removed, so a limit below ``--capture-rotate-bytes``
    could not be kept."""
    given = ("proxy", "--listen", ":1", "--upstream", "h:2", "--capture-dir", "/tmp/c")
    with pytest.raises(SystemExit) as exit_info:
        parse(*given, "--capture-rotate-bytes", "64M", env={"CORRFIX_CAPTURE_MAX_BYTES": "10M"})
    assert exit_info.value.code == 2
    assert "--capture-max-bytes (10485760) must be at least --capture-rotate-bytes" in capsys.readouterr().err
    assert parse(*given, "--capture-max-bytes", "1G").capture_max_bytes == 1 << 30


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("CORRFIX_CONNECT_RETRIES", "-1", "expected 0 (off) or a positive count, got -1"),
        ("CORRFIX_WORKERS", "0", "must be >= 1, got 0"),
        ("CORRFIX_DRAIN_TIMEOUT", "-1", "expected a non-negative number of seconds"),
        ("CORRFIX_DRAIN_TIMEOUT", "nan", "expected a non-negative number of seconds"),
        ("CORRFIX_PROBE_AFTER", "-1", "expected a non-negative number of seconds"),
        ("CORRFIX_PROBE_MIN", "0", "must be > 0"),
        ("CORRFIX_MAX_REQUEUES", "-1", "expected 0 (off) or a positive count, got -1"),
        ("CORRFIX_REQUEST_DEADLINE", "nan", "expected a non-negative number of seconds"),
        ("CORRFIX_MAX_OUTSTANDING", "0", "must be >= 1, got 0"),
        ("CORRFIX_MAX_HELD_BYTES", "-5", "size must be >= 0"),
        ("CORRFIX_MAX_CONNECTIONS", "0", "must be >= 1, got 0"),
        ("CORRFIX_IDLE_TIMEOUT", "0", "must be > 0"),
        ("CORRFIX_FRAME_TIMEOUT", "-1", "expected a non-negative number of seconds"),
        ("CORRFIX_CLOSE_LINGER", "inf", "expected a non-negative number of seconds"),
        ("CORRFIX_MAX_FRAME_SIZE", "0", "must be >= 1"),
        ("CORRFIX_CONNECT_TIMEOUT", "0", "must be > 0"),
        ("CORRFIX_BROKER_PORT_BASE", "70000", "expected a port from 1 to 65535, got 70000"),
        ("CORRFIX_BROKER_PORT", "1=70000", "expected a port from 1 to 65535, got 70000"),
    ],
)
def test_counts_and_timeouts_that_cannot_work_are_refused(capsys, variable, value, message):
    """Accepted before, and then: ``--connect-retries -1`` (read as "for ever") closed every
    client at once without a log line, ``--workers 0`` ran one process without a word,
    ``--drain-timeout -1`` closed every connection at SIGTERM and ``nan`` never did. So were a
    negative or ``nan`` probe timeout, a zero connect timeout or limit, and ports past 65535,
    from a flag, a variable and the file alike (``check-config`` called such a file valid)."""
    option = "--" + variable.removeprefix("CORRFIX_").lower().replace("_", "-")
    given = ("proxy", "--listen", ":1", "--upstream", "h:2")
    for flag, env in (((option, value), {}), ((), {variable: value})):
        with pytest.raises(SystemExit) as exit_info:
            parse(*given, *flag, env=env)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err


def test_other_corrfix_variables_are_not_settings():
    args = parse("proxy", "--listen", ":1", "--upstream", "h:2", env={"CORRFIX_REQUIRE_TSHARK": "1"})
    assert args.setting_sources["listen"] == "flag --listen"


def test_a_variable_set_empty_counts_as_unset(tmp_path):
    """``docker run -e CORRFIX_METRICS=`` is how a container takes back what its image sets
    (the image serves metrics): it stopped corrfix as a bad address instead."""
    file = tmp_path / "c.toml"
    file.write_text('metrics = "127.0.0.1:9464"\nprobe-after = 2.0\n')
    env = {"CORRFIX_METRICS": "", "CORRFIX_PROBE_AFTER": "", "CORRFIX_NO_REWRITE": ""}
    args = parse("proxy", "--listen", ":1", "--upstream", "h:2", "--config", str(file), env=env)
    assert args.metrics == Address("127.0.0.1", 9464) and args.probe_after == 2.0  # the file's
    assert args.rewrite is True
    assert parse("proxy", "--listen", ":1", "--upstream", "h:2", env=env).metrics is None


def test_a_variable_that_looks_like_a_mistyped_setting_is_named_at_start_up(monkeypatch, capsys):
    """Not only under --print-config: a typo would leave its setting at the default unseen.
    A variable near no setting belongs to other tooling (the tests' own) and is not named."""
    env = {"CORRFIX_PROBE_AFTR": "0.5", "CORRFIX_REQUIRE_TSHARK": "1"}
    args = parse("proxy", "--listen", ":1", "--upstream", "h:2", env=env)
    assert args.mistyped_variables == [("CORRFIX_PROBE_AFTR", "CORRFIX_PROBE_AFTER")]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(cli, "_run_proxy", lambda args: 0)  # started: nothing more to see
    assert cli.main(["proxy", "--listen", "127.0.0.1:1", "--upstream", "127.0.0.1:2"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "is not a setting" in line]
    assert len(warned) == 1
    assert "variable=CORRFIX_PROBE_AFTR" in warned[0] and "did_you_mean=CORRFIX_PROBE_AFTER" in warned[0]


def test_print_config_shows_each_setting_and_its_source_as_toml_that_reads_back(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text('[proxy]\nlisten = "127.0.0.1:19092"\nupstream = "h:9092"\nmax-requeues = 9\n')
    env = {
        "PATH": "/usr/bin:/bin",
        "CORRFIX_PROBE_AFTER": "0.25",
        "CORRFIX_BROKER_PORT": "3=19003",
        "CORRFIX_NO_CLIENT_COMPAT": "true",
        "CORRFIX_PROBE_AFTR": "9",
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "corrfix",
            "proxy",
            "--config",
            str(file),
            "--probe-min",
            "0.5",
            "--print-config",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    lines = {line.split(" = ")[0]: line for line in result.stdout.splitlines() if " = " in line}
    assert lines["probe-after"] == "probe-after = 0.25  # env CORRFIX_PROBE_AFTER"
    assert lines["probe-min"] == "probe-min = 0.5  # flag --probe-min; env CORRFIX_PROBE_MIN"
    assert lines["max-requeues"] == f"max-requeues = 9  # file {file}; env CORRFIX_MAX_REQUEUES"
    assert lines["request-deadline"].endswith("# default; env CORRFIX_REQUEST_DEADLINE")
    assert "# metrics is not set  # default; env CORRFIX_METRICS" in result.stdout
    assert (
        "# CORRFIX_PROBE_AFTR is not a setting and is ignored (did you mean CORRFIX_PROBE_AFTER?)"
        in result.stdout.splitlines()
    )
    assert f"# --config {file}" in result.stdout.splitlines()
    # The output is itself a config file that gives the same settings.
    printed = tmp_path / "printed.toml"
    printed.write_text(result.stdout)
    settings = tomllib.loads(result.stdout)["proxy"]
    assert settings["broker-port"] == ["3=19003"] and settings["client-compat"] is False
    again = parse("proxy", "--config", str(printed))
    assert proxy_config_from_args(again) == proxy_config_from_args(
        parse(
            "proxy",
            "--config",
            str(file),
            "--probe-min",
            "0.5",
            env={k: v for k, v in env.items() if k != "PATH"},
        )
    )


def test_print_config_still_says_what_is_missing(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse("proxy", "--print-config", env={"CORRFIX_UPSTREAM": "h:2"})
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert "# listen is not set" in captured.out
    assert "--listen is required (on the command line, as CORRFIX_LISTEN or in --config)" in captured.err
