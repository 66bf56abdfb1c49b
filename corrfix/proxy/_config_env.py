"""Settings from the environment: ``--probe-after 0.5`` is also ``CORRFIX_PROBE_AFTER=0.5``.

Containers and systemd units configure through the environment, so every long option of
``corrfix proxy`` has a variable: ``CORRFIX_`` and the option's name in capitals, dashes
as underscores. A switch takes ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/
``off``; a repeatable option takes a comma-separated list. A variable overrides the TOML
file and is overridden by a flag. A variable set empty counts as unset: ``-e CORRFIX_METRICS=``
is how a container takes back a setting its image gives. Other ``CORRFIX_`` variables (the
tests' own) are not settings and are left alone.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from corrfix.proxy._config_file import ConfigError, convert_setting, settable_actions

ENV_PREFIX = "CORRFIX_"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def env_name(option: str) -> str:
    """``--probe-after`` -> ``CORRFIX_PROBE_AFTER``."""
    return ENV_PREFIX + option.lstrip("-").upper().replace("-", "_")


def long_option(action: argparse.Action) -> str:
    """The action's first long option string (``--probe-after``)."""
    return next(option for option in action.option_strings if option.startswith("--"))


def env_variables(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every variable ``parser`` reads, with the action it sets."""
    return {env_name(long_option(action)): action for action in settable_actions(parser).values()}


def defaults_from_env(
    parser: argparse.ArgumentParser, environ: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """Argparse defaults from the environment, and which variable set each destination.

    Raises :class:`ConfigError` naming every variable whose value is not valid.
    """
    defaults: dict[str, Any] = {}
    sources: dict[str, str] = {}
    errors: list[str] = []
    for name, action in env_variables(parser).items():
        text = environ.get(name)
        if not text:  # unset, or set empty to take back an image's or a unit's value
            continue
        try:
            defaults[action.dest] = _convert(action, text, name)
        except ConfigError as exc:
            errors.append(str(exc))
            continue
        sources[action.dest] = name
    if errors:
        raise ConfigError("\n".join(errors))
    return defaults, sources


def _convert(action: argparse.Action, text: str, name: str) -> Any:
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        word = text.strip().lower()
        if word not in _TRUE | _FALSE:
            raise ConfigError(f"{name}={text!r}: expected 1, true, yes, on or 0, false, no, off")
        # The variable says whether the switch is given, as the flag would be.
        return action.const if word in _TRUE else not action.const
    value: Any = text
    if isinstance(action, argparse._AppendAction):
        value = [item.strip() for item in text.split(",") if item.strip()]
    return convert_setting(action, value, name)
