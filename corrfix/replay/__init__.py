"""Replay a capture's client requests against a broker and compare what comes back."""

from __future__ import annotations

from ._plan import load_plan
from ._relay import ReplayConfig, register_command, replay
from ._report import Status, build_report, error_codes, render_text

__all__ = [
    "ReplayConfig",
    "Status",
    "build_report",
    "error_codes",
    "load_plan",
    "register_command",
    "render_text",
    "replay",
]
