"""The docs name tests as proof of guarantees; every test they name must exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

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
