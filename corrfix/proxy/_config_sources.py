"""Where each setting came from, and ``corrfix proxy --print-config``.

Settings are layered: a flag beats a ``CORRFIX_`` variable, which beats the ``--config``
file, which beats the built-in default. The effective settings print as a TOML file
(``corrfix proxy --config`` reads it back), each line commented with its source.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from corrfix.proxy._config_env import ENV_PREFIX, env_name, env_variables, long_option
from corrfix.proxy._config_file import settable_actions, setting_key

DEFAULT = "default"


def given_on_command_line(
    parser: argparse.ArgumentParser, subparser: argparse.ArgumentParser, argv: Sequence[str]
) -> set[str]:
    """Destinations of ``subparser`` that ``argv`` sets with a flag.

    ``argv`` is parsed once more with every default of ``subparser`` suppressed, so only
    what the command line gave is in the result.
    """
    saved_actions = [(action, action.default) for action in subparser._actions]
    saved_defaults = dict(subparser._defaults)
    try:
        for action, _ in saved_actions:
            action.default = argparse.SUPPRESS
        subparser._defaults.clear()
        namespace = parser.parse_args(list(argv))
    finally:
        for action, default in saved_actions:
            action.default = default
        subparser._defaults.update(saved_defaults)
    return set(vars(namespace)) & set(settable_actions(subparser))


def setting_sources(
    subparser: argparse.ArgumentParser,
    flags: set[str],
    env: Mapping[str, str],
    file: Path | None,
    from_file: set[str],
) -> dict[str, str]:
    """For every setting, where its value came from (``flag --x``, ``env CORRFIX_X``, ...)."""
    sources: dict[str, str] = {}
    for dest, action in settable_actions(subparser).items():
        if dest in flags:
            sources[dest] = f"flag {long_option(action)}"
        elif dest in env:
            sources[dest] = f"env {env[dest]}"
        elif dest in from_file:
            sources[dest] = f"file {file}"
        else:
            sources[dest] = DEFAULT
    return sources


def render_effective(
    subparser: argparse.ArgumentParser,
    args: argparse.Namespace,
    sources: Mapping[str, str],
    environ: Mapping[str, str] | None = None,
) -> str:
    """The effective settings as TOML, each commented with its source and its variable.

    ``CORRFIX_`` variables in ``environ`` that name no setting are listed first, with the
    nearest variable that does: a typo there would otherwise go unnoticed."""
    lines = ["# corrfix proxy: effective settings (flag > CORRFIX_ variable > --config file > default)"]
    if args.config is not None:
        lines.append(f"# --config {args.config}")
    for name, nearest in unknown_variables(subparser, environ or {}):
        hint = f" (did you mean {nearest}?)" if nearest else ""
        lines.append(f"# {name} is not a setting and is ignored{hint}")
    lines.append("[proxy]")
    for dest, action in settable_actions(subparser).items():
        value = getattr(args, dest, None)
        source = sources.get(dest, DEFAULT)
        variable = env_name(long_option(action))
        note = f"# {source}" if source.startswith("env ") else f"# {source}; env {variable}"
        key = setting_key(dest)
        if value is None or value == []:
            lines.append(f"# {key} is not set  {note}")
        else:
            lines.append(f"{key} = {_toml(value)}  {note}")
    return "\n".join(lines) + "\n"


def unknown_variables(
    subparser: argparse.ArgumentParser, environ: Mapping[str, str]
) -> list[tuple[str, str | None]]:
    """``CORRFIX_`` variables that name no setting, each with the nearest one that does (None
    if none is near: a variable of other tooling, such as the tests' ``CORRFIX_REQUIRE_*``)."""
    known = set(env_variables(subparser)) | {ENV_PREFIX + "CONFIG"}
    unknown = []
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX) and name not in known:
            match = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
            unknown.append((name, match[0] if match else None))
    return unknown


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return json.dumps(_text(value))


def _text(value: Any) -> str:
    """A value as the text its option takes (``NODE=PORT`` for a broker port, ``HOST:PORT``)."""
    if isinstance(value, tuple):
        return "=".join(str(part) for part in value)
    return str(value)
