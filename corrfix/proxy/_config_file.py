"""Settings from a TOML file, for the same options as the command line.

Keys are the long option names, with dashes or underscores (``probe-after = 0.5``), at the
top level or in a ``[proxy]`` table. A flag on the command line overrides the file. An
unknown key is an error, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """The file cannot be read, or names a setting the command does not have."""


def defaults_from_toml(parser: argparse.ArgumentParser, path: Path) -> dict[str, Any]:
    """Argparse defaults for ``parser`` from the TOML file at ``path``, converted and checked."""
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    table = data.get("proxy", data)
    actions = {action.dest: action for action in parser._actions if action.dest != "help"}
    defaults: dict[str, Any] = {}
    for key, value in table.items():
        dest = key.replace("-", "_")
        action = actions.get(dest)
        if action is None or dest == "config":
            raise ConfigError(f"{path}: unknown setting {key!r}")
        defaults[dest] = _convert(action, value, path, key)
    return defaults


def _convert(action: argparse.Action, value: Any, path: Path, key: str) -> Any:
    def one(item: Any) -> Any:
        convert = action.type
        if callable(convert) and isinstance(item, str):
            try:
                return convert(item)
            except (ValueError, argparse.ArgumentTypeError) as exc:
                raise ConfigError(f"{path}: {key} = {item!r}: {exc}") from exc
        if action.choices is not None and item not in action.choices:
            raise ConfigError(f"{path}: {key} must be one of {sorted(action.choices)}")
        return item

    if isinstance(action, argparse._AppendAction):
        if not isinstance(value, list):
            raise ConfigError(f"{path}: {key} must be a list")
        return [one(item) for item in value]
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: {key} must be true or false")
        return value
    return one(value)
