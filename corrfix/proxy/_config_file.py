"""Settings from a TOML file, for the same options as the command line.

Keys are the long option names, with dashes or underscores (``probe-after = 0.5``), at the
top level or in a ``[proxy]`` table; a ``--no-X`` switch is the key ``X`` set to false. A
flag or a ``CORRFIX_`` variable overrides the file. An unknown key is an error naming the
nearest valid key, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import argparse
import difflib
import tomllib
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """The file cannot be read, or names a setting the command does not have."""


NOT_SETTINGS = frozenset({"help", "config", "print_config"})
"""Destinations that are actions, not settings a file can hold."""


def settable_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's settings by destination: every documented long option but the actions."""
    return {
        action.dest: action
        for action in parser._actions
        if action.dest not in NOT_SETTINGS and action.help != argparse.SUPPRESS and action.option_strings
    }


def setting_key(dest: str) -> str:
    """How a setting is spelled in a file: ``probe_after`` -> ``probe-after``."""
    return dest.replace("_", "-")


def toml_settings(path: Path) -> dict[str, Any]:
    """The table of settings in the file: its ``[proxy]`` table, or its top level."""
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    table = data.get("proxy", data)
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [proxy] must be a table")
    return table


def check_toml(parser: argparse.ArgumentParser, path: Path) -> tuple[dict[str, Any], list[str]]:
    """The file's settings as argparse defaults, and one message per thing wrong with it."""
    table = toml_settings(path)
    actions = settable_actions(parser)
    defaults: dict[str, Any] = {}
    errors: list[str] = []
    for key, value in table.items():
        dest = key.replace("-", "_")
        action = actions.get(dest)
        if action is None:
            errors.append(f"{path}: unknown setting {key!r}{_nearest(key, actions)}")
            continue
        try:
            defaults[dest] = convert_setting(action, value, key)
        except ConfigError as exc:
            errors.append(f"{path}: {exc}")
    return defaults, errors


def defaults_from_toml(parser: argparse.ArgumentParser, path: Path) -> dict[str, Any]:
    """Argparse defaults for ``parser`` from the TOML file at ``path``, converted and checked."""
    defaults, errors = check_toml(parser, path)
    if errors:
        raise ConfigError("\n".join(errors))
    return defaults


def _nearest(key: str, actions: dict[str, argparse.Action]) -> str:
    valid = [setting_key(dest) for dest in actions]
    match = difflib.get_close_matches(key.replace("_", "-"), valid, n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def convert_setting(action: argparse.Action, value: Any, key: str) -> Any:
    """``value`` (a TOML value, or the text of an environment variable) as the flag would give it."""

    def one(item: Any) -> Any:
        convert = action.type
        # A TOML number goes through the flag's checks as its text: 0 is no more a valid
        # --ready-interval in a file than on the command line.
        text = str(item) if isinstance(item, int | float) and not isinstance(item, bool) else item
        if callable(convert) and not isinstance(text, str):
            # A list, a table, a date or true where the flag takes text: unconverted, it would
            # reach the proxy as something no flag gives (a list of brokers: write them in one
            # string, as on the command line).
            raise ConfigError(f'{key} must be a string: "{action.metavar or action.dest.upper()}"')
        if callable(convert):
            try:
                item = convert(text)
            except (ValueError, argparse.ArgumentTypeError) as exc:
                raise ConfigError(f"{key} = {item!r}: {exc}") from exc
        if action.choices is not None and item not in action.choices:
            raise ConfigError(f"{key} must be one of {sorted(action.choices)}")
        return item

    if isinstance(action, argparse._AppendAction):
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list")
        return [one(item) for item in value]
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false")
        return value
    return one(value)
