"""The lab: Tansu brokers, client workloads, the chaos soak, the repair fuzzer and the demo.

Tooling for tests, benchmarks and the demo; no product module imports it (the CLI's
``demo`` command excepted). The Tansu launcher needs nothing optional; the workloads, the
soak and the demo need the client libraries of ``corrfix[demo]`` and load on first use,
failing with an error that names that extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corrfix._lazy import lazy_exports

from ._launch import CorrfixProcess
from ._repair_fuzz import run_repair_case
from ._tansu import (
    TANSU_NODE_ID,
    TansuBroker,
    TansuNotInstalledError,
    TansuPortInUseError,
    TansuStartError,
    find_tansu_binary,
)

if TYPE_CHECKING:
    from . import workload
    from ._demo import register_command, run_demo, sync_scene
    from ._soak import SoakOutcome, SoakPlan, run_soak

_LAZY = {
    "workload": ".workload",
    "register_command": "._demo",
    "run_demo": "._demo",
    "sync_scene": "._demo",
    "SoakOutcome": "._soak",
    "SoakPlan": "._soak",
    "run_soak": "._soak",
}

__all__ = [
    "TANSU_NODE_ID",
    "CorrfixProcess",
    "SoakOutcome",
    "SoakPlan",
    "TansuBroker",
    "TansuNotInstalledError",
    "TansuPortInUseError",
    "TansuStartError",
    "find_tansu_binary",
    "register_command",
    "run_demo",
    "run_repair_case",
    "run_soak",
    "sync_scene",
    "workload",
]


__getattr__ = lazy_exports(__name__, _LAZY)
