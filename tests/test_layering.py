"""The layering contract (pyproject.toml, [tool.importlinter]) holds, and the bench never
imports the test suite: the README's test command fails on a forbidden import."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint_imports is None:
        pytest.fail("lint-imports is missing: install the test extras (pip install -e '.[test]')")
    done = subprocess.run([lint_imports, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
    return modules


@pytest.mark.parametrize("script", sorted((ROOT / "bench").glob("*.py")), ids=lambda p: p.name)
def test_the_bench_never_imports_the_tests(script: Path):
    from_tests = sorted(m for m in imported_modules(script) if m == "tests" or m.startswith("tests."))
    assert from_tests == [], f"{script.name} imports {from_tests}: use protocol.testing or corrfix.lab"
