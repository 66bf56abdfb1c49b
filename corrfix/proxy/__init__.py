"""The trio shell: sockets, listeners, TLS, drain, metrics, workers, configuration and logs.

It moves bytes and timers; what to do with them is decided by :mod:`corrfix.core`.
"""

from __future__ import annotations

from ._bootstrap import Bootstrap
from ._config import ProxyConfig
from ._config_env import ENV_PREFIX, defaults_from_env
from ._config_file import ConfigError, check_toml, defaults_from_toml
from ._config_sources import given_on_command_line, render_effective, setting_sources, unknown_variables
from ._connection import ProxyConnection, ProxyStats
from ._logs import configure_logging, reopen_log_file
from ._metrics import ProxyMetrics
from ._observer import ConnectionObserver, PassObserver
from ._readiness import DEFAULT_READY_INTERVAL, DEFAULT_READY_STALE
from ._server import ListenError, Proxy
from ._service import ProxyService, open_admin
from ._tls import TlsConfig, TlsError, add_tls_arguments, tls_config_from_args
from ._workers import endpoints_to_serve, run_workers

__all__ = [
    "DEFAULT_READY_INTERVAL",
    "DEFAULT_READY_STALE",
    "ENV_PREFIX",
    "Bootstrap",
    "ConfigError",
    "ConnectionObserver",
    "ListenError",
    "PassObserver",
    "Proxy",
    "ProxyConfig",
    "ProxyConnection",
    "ProxyMetrics",
    "ProxyService",
    "ProxyStats",
    "TlsConfig",
    "TlsError",
    "add_tls_arguments",
    "check_toml",
    "configure_logging",
    "defaults_from_env",
    "defaults_from_toml",
    "endpoints_to_serve",
    "given_on_command_line",
    "open_admin",
    "render_effective",
    "reopen_log_file",
    "run_workers",
    "setting_sources",
    "tls_config_from_args",
    "unknown_variables",
]
