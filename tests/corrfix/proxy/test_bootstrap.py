"""Several bootstrap brokers in ``--upstream``, as in a client's ``bootstrap.servers``."""

from __future__ import annotations

import urllib.request

import pytest

from corrfix._cli import _with_config_file, build_parser, proxy_config_from_args
from corrfix._netutil import free_ports
from corrfix.core import Address
from corrfix.lab import CorrfixProcess, workload
from corrfix.proxy import Bootstrap
from corrfix.proxy._bootstrap import BootstrapOrder
from tests.support.health import wait_for_status

A, B, C = Address("a", 1), Address("b", 2), Address("c", 3)


def test_the_list_is_parsed_in_order_and_shown_as_given():
    bootstrap = Bootstrap.parse("a:1, b:2,[::1]:3")
    assert bootstrap.addresses == (A, B, Address("::1", 3))
    assert str(bootstrap) == "a:1,b:2,[::1]:3"
    assert Bootstrap.parse("a:1").addresses == (A,)


@pytest.mark.parametrize(
    ("text", "message"), [("a:1,,b:2", "HOST:PORT"), ("a:1,a:1", "named twice"), ("a", "HOST:PORT")]
)
def test_a_list_that_cannot_work_is_refused(text, message):
    with pytest.raises(ValueError, match=message):
        Bootstrap.parse(text)


def settings(*argv: str, env: dict[str, str] | None = None):
    """``corrfix proxy``'s settings as its command line, its variables and its file give them."""
    parser = build_parser()
    return _with_config_file(parser, parser.parse_args(["proxy", *argv]), ["proxy", *argv], env or {})


def test_the_command_line_variable_and_print_config_take_the_list(capsys, tmp_path):
    args = settings("--listen", ":9", "--upstream", "a:1,b:2,c:3")
    config = proxy_config_from_args(args)
    assert (config.upstream, config.fallback_upstreams, config.bootstrap) == (A, (B, C), (A, B, C))
    from_env = settings("--listen", ":9", env={"CORRFIX_UPSTREAM": "b:2, c:3"})
    assert proxy_config_from_args(from_env).bootstrap == (B, C)
    file = tmp_path / "c.toml"
    file.write_text('[proxy]\nlisten = ":9"\nupstream = "c:3,a:1"\n')
    assert proxy_config_from_args(settings("--config", str(file))).bootstrap == (C, A)
    with pytest.raises(SystemExit):
        settings("--listen", ":9", "--upstream", "a:1,a:1")
    assert "--upstream" in capsys.readouterr().err
    settings("--config", str(file), "--print-config")
    assert 'upstream = "c:3,a:1"' in capsys.readouterr().out


def test_connections_start_at_the_broker_that_last_accepted_one():
    """A dead first broker costs its connect timeout once, not once per connection."""
    order = BootstrapOrder((A, B, C))
    assert order.candidates() == (A, B, C)
    order.accepted(B)
    assert order.candidates() == (B, C, A)
    order.accepted(Address("elsewhere", 9))  # a broker's own address: not a bootstrap
    assert order.candidates() == (B, C, A)
    order.accepted(A)
    assert order.candidates() == (A, B, C)


@pytest.mark.broker
def test_a_dead_first_bootstrap_broker_is_skipped_and_clients_lose_nothing(tansu_factory, tmp_path):
    """Given ``DEAD,TANSU``, corrfix served no client while the first broker was down: every
    connection closed after its connect retries. Now the next broker serves, /readyz is 200
    while one answers, and ``corrfix_upstream_up`` names the dead one."""
    port, dead, metrics_port = free_ports(3)
    broker = tansu_factory(advertised_port=port)  # every connection comes through the bootstrap listener
    upstream = f"127.0.0.1:{dead},{broker.bootstrap}"
    args = ["proxy", "--listen", f"127.0.0.1:{port}", "--upstream", upstream]
    args += ["--metrics", f"127.0.0.1:{metrics_port}", "--ready-interval", "0.1", "--ready-stale", "0.5"]
    n = 500
    with CorrfixProcess(args, port, tmp_path / "p.log") as proxy:
        body = wait_for_status(f"http://127.0.0.1:{metrics_port}/readyz", 200)
        assert [(u["upstream"], u["ok"]) for u in body["upstreams"]] == [
            (f"127.0.0.1:{dead}", False),
            (broker.bootstrap, True),
        ]
        bootstrap = f"127.0.0.1:{port}"
        workload.create_topic(bootstrap, "fallback")
        produced = workload.produce_kafka_python(bootstrap, "fallback", n)
        values = workload.consume_all(bootstrap, "fallback", n, timeout=60)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
            scraped = response.read().decode()
        records = proxy.records()
    assert produced.correlation_errors == 0 and sorted(values) == workload.expected_values(n)
    assert f'corrfix_upstream_up{{upstream="127.0.0.1:{dead}"}} 0.0' in scraped
    assert f'corrfix_upstream_up{{upstream="{broker.bootstrap}"}} 1.0' in scraped
    opened = [r for r in records if r["event"] == "connection opened"]
    skipped = [r for r in records if r["event"] == "upstream connect failed, trying the next"]
    assert opened and all(r["upstream"] == broker.bootstrap for r in opened)
    assert skipped and all(r["upstream"] == f"127.0.0.1:{dead}" for r in skipped)
    assert len(skipped) < len(opened)  # the broker that accepted is tried first from then on
    assert not [r for r in records if r["event"] == "upstream unreachable, closing client"]
