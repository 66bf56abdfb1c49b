"""What the docs name must exist: the tests they cite as proof, the settings, metrics,
modules and files they describe."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

from corrfix._cli import build_parser
from corrfix.proxy._config_env import long_option
from corrfix.proxy._config_file import settable_actions, setting_key

ROOT = Path(__file__).parent.parent
TEST_REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
    }


def test_reliability_names_only_tests_that_exist():
    text = (ROOT / "docs" / "reliability.md").read_text()
    references = TEST_REFERENCE.findall(text)
    assert len(references) > 20
    missing = [
        f"{file}::{name}"
        for file, name in references
        if not (ROOT / file).exists() or name not in defined_tests(ROOT / file)
    ]
    assert missing == []


def proxy_parser() -> argparse.ArgumentParser:
    return build_parser("proxy")._proxy_parser  # type: ignore[attr-defined]


def readme_option_rows() -> dict[str, str]:
    """The README's ``corrfix proxy`` table: each option it names, with its row."""
    rows = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("| `--"):
            first_cell = line.split("|")[1]
            for option in re.findall(r"`(--[\w-]+)", first_cell):
                rows[option] = line
    return rows


def test_the_readme_gives_every_off_switch_its_config_file_key():
    """A ``--no-X`` switch is ``X = false`` in a ``--config`` file, not ``no-X``."""
    rows = readme_option_rows()
    switches = [
        (long_option(action), setting_key(action.dest))
        for action in settable_actions(proxy_parser()).values()
        if isinstance(action, argparse._StoreFalseAction)
    ]
    assert len(switches) >= 4
    missing = [option for option, key in switches if f"`{key} = false`" not in rows.get(option, "")]
    assert missing == []
