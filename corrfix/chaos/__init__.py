"""The chaos relay: a TCP relay that loses, delays, reorders and cuts Kafka traffic on purpose.

:class:`ChaosPolicy` decides (sans-IO); the trio relay carries it out; ``corrfix chaos``
is its command line.
"""

from __future__ import annotations

from ._cli import add_chaos_arguments, chaos_config_from_args, run_chaos
from ._policy import Action, ApiCounts, ChaosPolicy, ChaosRules, api_label, parse_api_key, parse_api_keys
from ._relay import ChaosConfig, ChaosRelay, serve_chaos

__all__ = [
    "Action",
    "ApiCounts",
    "ChaosConfig",
    "ChaosPolicy",
    "ChaosRelay",
    "ChaosRules",
    "add_chaos_arguments",
    "api_label",
    "chaos_config_from_args",
    "parse_api_key",
    "parse_api_keys",
    "run_chaos",
    "serve_chaos",
]
