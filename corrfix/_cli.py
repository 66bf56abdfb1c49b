"""The ``corrfix`` command line: ``proxy``, ``chaos`` and ``demo``."""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
import trio

from corrfix import _argtypes as argtypes
from corrfix._main import add_common as _add_common
from corrfix._version import VersionAction
from corrfix.core import Address, BrokerPorts, RepairConfig
from corrfix.proxy import (
    DEFAULT_READY_INTERVAL,
    DEFAULT_READY_STALE,
    ENV_PREFIX,
    Bootstrap,
    ConfigError,
    ListenError,
    Proxy,
    ProxyConfig,
    ProxyMetrics,
    ProxyService,
    add_tls_arguments,
    check_toml,
    configure_logging,
    defaults_from_env,
    defaults_from_toml,
    endpoints_to_serve,
    given_on_command_line,
    open_admin,
    render_effective,
    reopen_log_file,
    setting_sources,
    tls_config_from_args,
    unknown_variables,
)

if TYPE_CHECKING:
    from corrfix.capture._writer import CaptureWriter

log = structlog.get_logger("corrfix")
DRAIN_TIMEOUT = 30.0


def _add_proxy_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    defaults = RepairConfig()
    relay_defaults = ProxyConfig(Address("127.0.0.1", 0), Address("127.0.0.1", 0))
    p = subparsers.add_parser(
        "proxy",
        help="relay Kafka clients to a broker, repairing lost and out-of-order responses",
        description="Relay every Kafka request to the upstream broker with proxy-owned correlation "
        "ids; re-queue requests whose answers were skipped or lost, drop stray answers, and "
        "deliver answers to each client strictly in its request order.",
    )
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML file of these settings (long option names as keys); flags and CORRFIX_ "
        "variables override it (default: $CORRFIX_CONFIG)",
    )
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective settings as TOML, each with where it came from (flag, "
        "CORRFIX_ variable, --config file or default), and exit",
    )
    p.add_argument("--listen", type=Address.parse, metavar="HOST:PORT", help="where clients connect")
    p.add_argument(
        "--upstream",
        type=Bootstrap.parse,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="the bootstrap broker, or several, tried in turn when one cannot be reached",
    )
    p.add_argument(
        "--probe-after",
        type=argtypes.positive,
        default=defaults.probe_after,
        metavar="SECONDS",
        help="longest wait for the oldest answer before a probe is sent; Fetch adds its max_wait_ms "
        f"(default {defaults.probe_after})",
    )
    p.add_argument(
        "--probe-min",
        type=argtypes.positive,
        default=defaults.probe_min,
        metavar="SECONDS",
        help="shortest adaptive probe timeout, learned per api key from observed latency "
        f"(default {defaults.probe_min})",
    )
    p.add_argument(
        "--max-requeues",
        type=argtypes.count,
        default=defaults.max_requeues,
        help=f"re-sends of one request before its client is disconnected (default {defaults.max_requeues})",
    )
    p.add_argument(
        "--request-deadline",
        type=argtypes.positive,
        default=defaults.request_deadline,
        metavar="SECONDS",
        help="disconnect a client whose request is unanswered this long; a JoinGroup's "
        f"counts from the end of its rebalance timeout (default {defaults.request_deadline:g})",
    )
    p.add_argument(
        "--max-outstanding",
        type=argtypes.at_least_one,
        default=defaults.max_outstanding,
        help=f"unanswered requests per connection before reading pauses (default {defaults.max_outstanding})",
    )
    p.add_argument(
        "--max-outstanding-bytes",
        type=argtypes.positive_size,
        default=defaults.max_outstanding_bytes,
        help="bytes of unanswered requests kept for re-sending per connection before reading "
        f"pauses (default {defaults.max_outstanding_bytes})",
    )
    p.add_argument(
        "--max-held-bytes",
        type=argtypes.positive_size,
        default=defaults.max_held_bytes,
        help="bytes of out-of-order answers held per connection before reading pauses "
        f"(default {defaults.max_held_bytes})",
    )
    p.add_argument(
        "--produce-policy",
        choices=["requeue", "disconnect"],
        default=defaults.produce_policy,
        help="what to do when the answer to a Produce without a producer id is lost: re-send it "
        "(at-least-once; logged as a possible duplicate) or disconnect the client (default requeue)",
    )
    p.add_argument(
        "--no-client-compat",
        dest="client_compat",
        action="store_false",
        default=defaults.client_compat,
        help="relay answers unchanged even to clients known to misread them; by default the "
        "ApiVersions answer to librdkafka 1.4.0 to 2.1.1 (e.g. Debian 12's kcat) loses its optional "
        "tagged fields, counted as client_compat (in --config: client-compat = false)",
    )
    cluster = p.add_argument_group("keeping clients on the proxy")
    cluster.add_argument(
        "--advertised-host",
        metavar="HOST",
        help="host clients are told for every broker listener (default: the --listen host; "
        "required when listening on a wildcard address)",
    )
    cluster.add_argument(
        "--broker-port",
        type=_node_port,
        action="append",
        default=[],
        metavar="NODE=PORT",
        help="proxy port that stands in for broker NODE (repeatable)",
    )
    cluster.add_argument(
        "--broker-port-base",
        type=argtypes.port,
        metavar="PORT",
        help="brokers without --broker-port get PORT + node id (default: any free port)",
    )
    cluster.add_argument(
        "--broker-state",
        type=Path,
        metavar="FILE",
        help="keep the brokers learned in FILE and open their listeners again at the next start, "
        "so that clients which cached them reconnect after a restart",
    )
    cluster.add_argument(
        "--no-rewrite",
        dest="rewrite",
        action="store_false",
        help="relay bytes only: do not rewrite broker addresses nor cap ApiVersions",
    )
    p.add_argument(
        "--metrics",
        type=Address.parse,
        metavar="HOST:PORT",
        help="serve Prometheus metrics at /metrics, and /livez and /readyz",
    )
    health = p.add_argument_group("health (/livez, /readyz)")
    health.add_argument(
        "--admin",
        type=Address.parse,
        metavar="HOST:PORT",
        help="serve /livez and /readyz here (they are served on --metrics too)",
    )
    health.add_argument(
        "--ready-interval",
        type=argtypes.positive,
        default=DEFAULT_READY_INTERVAL,
        metavar="SECONDS",
        help="how often each upstream gets an ApiVersions request for /readyz "
        f"(default {DEFAULT_READY_INTERVAL:g})",
    )
    health.add_argument(
        "--ready-stale",
        type=argtypes.positive,
        default=DEFAULT_READY_STALE,
        metavar="SECONDS",
        help="/readyz fails when an upstream's last ApiVersions answer is older than this; more "
        f"than --ready-interval (default {DEFAULT_READY_STALE:g})",
    )
    p.add_argument(
        "--workers",
        type=argtypes.at_least_one,
        default=1,
        metavar="N",
        help="run N proxy processes sharing the listen ports (SO_REUSEPORT); a connection lives in "
        "one of them and --metrics sums them all (default 1)",
    )
    p.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--no-engine",
        dest="engine",
        action="store_false",
        help="relay every connection with tasks of its own instead of the relay engine (one epoll "
        "set and one thread for every plaintext connection); TLS connections always use tasks "
        "(in --config: engine = false)",
    )
    limits = p.add_argument_group("limits")
    limits.add_argument(
        "--max-connections",
        type=argtypes.at_least_one,
        default=relay_defaults.max_connections,
        help=f"client connections beyond this are closed at once (default {relay_defaults.max_connections})",
    )
    limits.add_argument(
        "--idle-timeout",
        type=argtypes.positive,
        default=relay_defaults.idle_timeout,
        metavar="SECONDS",
        help="close a connection with nothing outstanding and no traffic this long "
        f"(default {relay_defaults.idle_timeout:g})",
    )
    limits.add_argument(
        "--frame-timeout",
        type=argtypes.positive,
        default=relay_defaults.frame_timeout,
        metavar="SECONDS",
        help="close a client whose request frame stays incomplete this long (slowloris) "
        f"(default {relay_defaults.frame_timeout:g})",
    )
    limits.add_argument(
        "--close-linger",
        type=argtypes.seconds,
        default=relay_defaults.close_linger,
        metavar="SECONDS",
        help="after a client leaves, every request it sent is passed on and the broker side "
        "half-closed; wait this long for the broker to close before closing anyway "
        f"(default {relay_defaults.close_linger:g})",
    )
    limits.add_argument(
        "--connect-retries",
        type=argtypes.count,
        default=relay_defaults.connect_retries,
        help=f"upstream connect retries, with backoff (default {relay_defaults.connect_retries})",
    )
    limits.add_argument(
        "--drain-timeout",
        type=argtypes.seconds,
        default=DRAIN_TIMEOUT,
        metavar="SECONDS",
        help="on SIGTERM, stop accepting and let outstanding requests finish this long; "
        f"SIGINT or a second SIGTERM stops at once (default {DRAIN_TIMEOUT:g})",
    )
    p.add_argument(
        "--max-frame-size",
        type=argtypes.positive_size,
        default=relay_defaults.max_frame_size,
        metavar="BYTES",
    )
    p.add_argument(
        "--connect-timeout", type=argtypes.positive, default=relay_defaults.connect_timeout, metavar="SECONDS"
    )
    from corrfix.capture._options import add_capture_arguments

    add_capture_arguments(p)
    add_tls_arguments(p)
    _add_common(p)
    p.add_argument(
        "--log-file",
        type=Path,
        metavar="FILE",
        help="log to FILE instead of stderr; SIGHUP re-opens it (and starts new capture files and "
        "loads the TLS files anew)",
    )
    p.set_defaults(run=_run_proxy)
    return p


def proxy_config_from_args(args: argparse.Namespace) -> ProxyConfig:
    return ProxyConfig(
        listen=args.listen,
        upstream=args.upstream.addresses[0],
        fallback_upstreams=args.upstream.addresses[1:],
        repair=RepairConfig(
            probe_after=args.probe_after,
            probe_min=args.probe_min,
            max_requeues=args.max_requeues,
            request_deadline=args.request_deadline,
            max_outstanding=args.max_outstanding,
            max_outstanding_bytes=args.max_outstanding_bytes,
            max_held_bytes=args.max_held_bytes,
            produce_policy=args.produce_policy,
            client_compat=args.client_compat,
        ),
        max_frame_size=args.max_frame_size,
        connect_timeout=args.connect_timeout,
        connect_retries=args.connect_retries,
        max_connections=args.max_connections,
        idle_timeout=args.idle_timeout,
        frame_timeout=args.frame_timeout,
        close_linger=args.close_linger,
        reuse_port=args.reuse_port,
        rewrite=args.rewrite,
        advertised_host=args.advertised_host,
        broker_ports=BrokerPorts(dict(args.broker_port), args.broker_port_base),
        broker_state=args.broker_state,
        tls=tls_config_from_args(args),
        engine=args.engine,
    )


def _node_port(text: str) -> tuple[int, int]:
    node, sep, port = text.partition("=")
    if not sep or not node.strip().lstrip("-").isdigit() or not port.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected NODE=PORT, got {text!r}")
    return int(node), argtypes.port(port)


def _run_proxy(args: argparse.Namespace) -> int:
    from corrfix.capture._options import capture_writer_from_args

    if args.workers > 1:
        from corrfix.proxy._workers import run_workers

        return run_workers(args.raw_argv[1:], args.workers, args.metrics, admin=args.admin)

    # A worker of --workers serves one endpoint of its own, not the user's (its supervisor's).
    args.metrics, args.admin = endpoints_to_serve(args.metrics, args.admin)
    metrics = ProxyMetrics() if args.metrics else None
    try:
        writer = capture_writer_from_args(args)
        proxy = Proxy(proxy_config_from_args(args), observer=writer, metrics=metrics)
        service = ProxyService.build(
            proxy,
            ready_interval=args.ready_interval,
            ready_stale=args.ready_stale,
            checked=bool(args.metrics or args.admin),
            reopen=functools.partial(_reopen_files, writer),
        )
        open_admin(service, metrics, args.metrics, args.admin, writer)
    except (ValueError, OSError) as exc:
        log.error("cannot start", error=str(exc))
        return 2
    if writer is not None:
        writer.start()
    try:
        drain = functools.partial(service.drain, args.drain_timeout)
        trio.run(functools.partial(run_until_signalled, service.serve, drain=drain, reload=service.reload))
    except ExceptionGroup as group:
        cannot_listen, rest = group.split(ListenError)
        if cannot_listen is None:
            raise
        if rest is not None:
            raise rest from None
        log.error("cannot start", error=str(_first_leaf(cannot_listen)))
        return 2
    finally:
        if writer is not None:
            writer.close()
    log.info("proxy stopped", connections=proxy.stats.connections_opened, **dict(proxy.stats.repairs))
    return 0


def _reopen_files(writer: CaptureWriter | None) -> None:
    reopen_log_file()
    if writer is not None:
        writer.reopen()


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first exception inside a (possibly nested) exception group."""
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


async def run_until_signalled(
    main: Callable[[], Awaitable[object]],
    drain: Callable[[], None] | None = None,
    reload: Callable[[], None] | None = None,
) -> None:
    """Run ``main`` until it returns or a signal stops it.

    With ``drain``, the first SIGTERM calls it and ``main`` is left to finish; SIGINT, or
    SIGTERM without ``drain`` or a second time, cancels ``main`` at once. With ``reload``,
    each SIGHUP calls it.
    """
    async with trio.open_nursery() as nursery:

        async def run_main() -> None:
            await main()
            nursery.cancel_scope.cancel()

        nursery.start_soon(run_main)
        wanted = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGHUP] if reload is not None else [])
        with trio.open_signal_receiver(*wanted) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if signum == signal.SIGHUP and reload is not None:
                    reload()
                    continue
                if signum == signal.SIGTERM and drain is not None:
                    log.info("draining", signal=name)
                    drain()
                    drain = None
                    continue
                log.info("stopping", signal=name)
                nursery.cancel_scope.cancel()
                return


def _with_config_file(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    argv: Sequence[str] | None,
    environ: Mapping[str, str] | None = None,
) -> argparse.Namespace:
    """Re-parse with the file's, then the environment's settings as defaults, so that a flag
    beats a ``CORRFIX_`` variable, which beats the file; ``args.setting_sources`` says which won."""
    proxy_parser = parser._proxy_parser  # type: ignore[attr-defined]
    environ = os.environ if environ is None else environ
    argv = list(sys.argv[1:] if argv is None else argv)
    config = args.config
    if config is None and environ.get(CONFIG_VARIABLE):
        config = Path(environ[CONFIG_VARIABLE])
    try:
        env_defaults, env_sources = defaults_from_env(proxy_parser, environ)
        file_defaults = defaults_from_toml(proxy_parser, config) if config is not None else {}
    except ConfigError as exc:
        parser.exit(2, f"corrfix proxy: {exc}\n")
    flags = given_on_command_line(parser, proxy_parser, argv)
    proxy_parser.set_defaults(**file_defaults)
    proxy_parser.set_defaults(**env_defaults)
    # A repeatable flag replaces the variable's or the file's list, as any flag replaces their
    # value: argparse would append to it.
    lists = [a.dest for a in proxy_parser._actions if isinstance(a, argparse._AppendAction)]
    proxy_parser.set_defaults(**{dest: [] for dest in lists if dest in flags})
    args = parser.parse_args(argv)
    args.config = config
    args.setting_sources = setting_sources(proxy_parser, flags, env_sources, config, set(file_defaults))
    # A typo in a variable's name would leave its setting at the default without a word.
    args.mistyped_variables = [
        (name, nearest) for name, nearest in unknown_variables(proxy_parser, environ) if nearest
    ]
    if args.print_config:
        sys.stdout.write(render_effective(proxy_parser, args, args.setting_sources, environ))
    for name in ("listen", "upstream"):
        if getattr(args, name) is None:
            proxy_parser.error(
                f"--{name} is required (on the command line, as {ENV_PREFIX}{name.upper()} or in --config)"
            )
    for conflict in setting_conflicts(args):
        proxy_parser.error(conflict)
    return args


def setting_conflicts(settings: argparse.Namespace) -> list[str]:
    """Settings each valid alone that cannot work together."""
    from corrfix.capture._options import capture_conflicts

    conflicts = capture_conflicts(settings) + _broker_port_conflicts(settings)
    if settings.ready_stale <= settings.ready_interval:  # each answer goes stale before the next check
        conflicts.append(
            f"--ready-stale ({settings.ready_stale:g} s) must be longer than --ready-interval "
            f"({settings.ready_interval:g} s), or /readyz fails between every two checks"
        )
    return conflicts


def _broker_port_conflicts(settings: argparse.Namespace) -> list[str]:
    """Broker ports given that would share a listener: with --workers (SO_REUSEPORT) both binds
    succeed and the kernel hands some of one broker's connections to the other's relay."""
    conflicts = []
    listen_port = settings.listen.port if settings.listen is not None else 0
    owners: dict[int, str] = {}
    nodes: dict[int, int] = {}
    for node_id, port in settings.broker_port:
        if nodes.setdefault(node_id, port) != port:
            conflicts.append(f"--broker-port gives node {node_id} two ports, {nodes[node_id]} and {port}")
        elif listen_port and port == listen_port:
            conflicts.append(f"--broker-port {node_id}={port} is the --listen port")
        elif owners.setdefault(port, f"{node_id}={port}") != f"{node_id}={port}":
            conflicts.append(f"--broker-port {owners[port]} and {node_id}={port} share a port")
    return conflicts


CONFIG_VARIABLE = ENV_PREFIX + "CONFIG"


def _add_check_config_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "check-config",
        help="validate a corrfix proxy TOML file without starting",
        description="Check every key and value of a `corrfix proxy --config` file: an unknown key "
        "is an error naming the nearest valid one. Exit status 0 when valid, 1 when not.",
    )
    p.add_argument("file", type=Path, metavar="FILE")
    _add_common(p)
    p.set_defaults(run=_run_check_config)


def _run_check_config(args: argparse.Namespace) -> int:
    proxy_parser = build_parser()._proxy_parser  # type: ignore[attr-defined]
    try:
        defaults, errors = check_toml(proxy_parser, args.file)
    except ConfigError as exc:
        errors, defaults = [str(exc)], {}
    if not errors:
        proxy_parser.set_defaults(**defaults)
        settings = proxy_parser.parse_args([])
        errors = [f"{args.file}: {conflict}" for conflict in setting_conflicts(settings)]
        if not errors and defaults.get("listen") and defaults.get("upstream"):
            try:
                proxy_config_from_args(settings)
            except (ValueError, OSError) as exc:  # e.g. a TLS file that is missing or does not match
                errors.append(f"{args.file}: {exc}")
    if errors:
        for error in errors:
            print(error, file=sys.stderr)
        return 1
    missing = [f"--{name}" for name in ("listen", "upstream") if not defaults.get(name)]
    note = f"; {' and '.join(missing)} to come from flags or {ENV_PREFIX} variables" if missing else ""
    print(f"{args.file}: valid ({len(defaults)} settings{note})")
    return 0


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line; given the ``command`` being run, only its subparser besides the
    proxy's, so that ``corrfix proxy`` loads none of the other commands' modules (pyarrow,
    numpy, dpkt, the audit)."""
    parser = argparse.ArgumentParser(
        prog="corrfix",
        description="A Kafka sidecar proxy that owns correlation ids and repairs lost, stray and "
        "out-of-order responses.",
    )
    parser.add_argument(
        "--version",
        action=VersionAction,
        help="print corrfix's version, Python's and its libraries', and exit",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parser._proxy_parser = _add_proxy_parser(subparsers)  # type: ignore[attr-defined]
    for name, add in _COMMANDS.items():
        if command in (None, name):
            add(subparsers)
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` runs, when it starts with one that :func:`build_parser` knows."""
    return argv[0] if argv and argv[0] in (*_COMMANDS, "proxy") else None


def _add_audit_parser(subparsers: argparse._SubParsersAction) -> None:
    from spark_audit import register_command  # pyspark itself is imported only when it runs

    _add_common(register_command(subparsers))


def _add_replay_parser(subparsers: argparse._SubParsersAction) -> None:
    from corrfix.replay._relay import register_command

    _add_common(register_command(subparsers))


def _add_capture_parser(subparsers: argparse._SubParsersAction) -> None:
    from corrfix.capture._commands import add_capture_commands

    p = subparsers.add_parser("capture", help="inspect, export and import captures")
    commands = p.add_subparsers(dest="capture_command", required=True, metavar="COMMAND")
    for command in add_capture_commands(commands).values():
        _add_common(command)


def _add_chaos_parser(subparsers: argparse._SubParsersAction) -> None:
    from corrfix.chaos import add_chaos_arguments

    p = subparsers.add_parser(
        "chaos",
        help="a Kafka-aware relay that drops, duplicates or delays responses, to test pipelines",
        description="Relay Kafka traffic and damage responses on purpose: drop, duplicate or delay "
        "every Nth or with a seeded probability, filtered by api key. Prints what it did.",
    )
    add_chaos_arguments(p)
    _add_common(p)
    p.set_defaults(run=_run_chaos)


def _run_chaos(args: argparse.Namespace) -> int:
    from corrfix.chaos import chaos_config_from_args, run_chaos

    config = chaos_config_from_args(args)
    trio.run(run_until_signalled, lambda: run_chaos(config, handle_signals=False))
    return 0


def _add_demo_parser(subparsers: argparse._SubParsersAction) -> None:
    from corrfix.lab._demo import register_command

    p = register_command(subparsers)
    _add_common(p)
    p.set_defaults(run=_run_demo, log_level="warning")


def _run_demo(args: argparse.Namespace) -> int:
    from corrfix.lab._demo import run_demo

    return run_demo(args)


_COMMANDS: dict[str, Callable[[argparse._SubParsersAction], object]] = {
    "check-config": _add_check_config_parser,
    "chaos": _add_chaos_parser,
    "capture": _add_capture_parser,
    "replay": _add_replay_parser,
    "demo": _add_demo_parser,
    "audit": _add_audit_parser,
}
"""The commands besides ``proxy``, in the order ``--help`` lists them."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(_command_of(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    if args.command == "proxy":
        args = _with_config_file(parser, args, argv)
        if args.print_config:
            return 0
        args.raw_argv = list(sys.argv[1:] if argv is None else argv)
    configure_logging(json=args.log_json, level=args.log_level, file=getattr(args, "log_file", None))
    for name, nearest in getattr(args, "mistyped_variables", []):
        log.warning("variable is not a setting and is ignored", variable=name, did_you_mean=nearest)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
