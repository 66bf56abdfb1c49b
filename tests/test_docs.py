"""What the docs name must exist: the tests they cite as proof, the settings, metrics,
modules and files they describe."""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path

from prometheus_client.samples import Sample

from corrfix._cli import build_parser
from corrfix.core import Address
from corrfix.proxy import ProxyMetrics
from corrfix.proxy._config_env import long_option
from corrfix.proxy._config_file import settable_actions, setting_key
from corrfix.proxy._engine_metrics import EngineCollector
from corrfix.proxy._health import Readiness
from corrfix.proxy._health_metrics import HealthCollector

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


def scrape(requests_seen: bool) -> dict[str, list[Sample]]:
    """What a ``corrfix proxy --metrics --capture-dir`` serves, by metric name as scraped."""
    metrics = ProxyMetrics()
    if requests_seen:  # an api's series appear once it has been seen
        tally = metrics.tally()
        tally.requests[0] = 1
        tally.answer(0, 0.001)
    readiness = Readiness([Address("127.0.0.1", 9092)], stale=15.0)
    metrics.registry.register(HealthCollector(readiness, max_connections=10, capture=lambda: (0, 0, 0)))
    metrics.registry.register(EngineCollector(lambda: None))
    return {
        family.name + ("_total" if family.type == "counter" else ""): family.samples
        for family in metrics.registry.collect()
    }


def exported_metrics() -> dict[str, set[str]]:
    """Every metric served, with its labels."""
    return {
        name: {label for sample in samples for label in sample.labels} - {"le"}
        for name, samples in scrape(requests_seen=True).items()
    }


def test_the_readme_lists_every_metric_with_its_labels():
    documented = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("| `corrfix_"):
            names, labels = line.split("|")[1:3]
            for name in re.findall(r"`(corrfix_\w+)`", names):
                documented[name] = set(re.findall(r"`(\w+)`", labels))
    assert documented == exported_metrics()


def test_the_dashboard_finds_a_corrfix_that_has_relayed_nothing_yet():
    """Its instance list comes from a metric with a series before the first request, so a
    corrfix without clients yet shows whether it is ready."""
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "corrfix-dashboard.json").read_text())
    served = {name for name, samples in scrape(requests_seen=False).items() if samples}
    for variable in dashboard["templating"]["list"]:
        match = re.fullmatch(r"label_values\((\w+), instance\)", variable["query"]["query"])
        assert match is not None and match[1] in served, variable["query"]["query"]


MAP_ENTRY = re.compile(r"( *)([\w.]+/|[\w.]+\.py(?:, [\w.]+\.py)*)(?: +(.*))?")


def module_map() -> dict[Path, str]:
    """docs/design.md's module map: each folder and module it names, with its description."""
    text = (ROOT / "docs" / "design.md").read_text()
    block = text.split("## Module map", 1)[1].split("```")[1]
    entries: dict[Path, str] = {}
    folders: list[Path] = []  # the folder at each indentation level
    names: list[Path] = []
    for line in block.strip("\n").splitlines():
        match = MAP_ENTRY.fullmatch(line)
        if match is None:  # a description's next line
            for path in names:
                entries[path] += " " + line.strip()
            continue
        depth = len(match[1]) // 2
        folders = folders[:depth]
        parent = folders[-1] if folders else Path()
        names = [parent / name for name in match[2].split(", ")]
        for path in names:
            entries[path] = match[3] or ""
        if match[2].endswith("/"):
            folders.append(parent / match[2])
    return entries


def test_the_module_map_names_every_module_and_only_modules_that_exist():
    entries = module_map()
    assert len(entries) > 100
    missing = [str(path) for path in entries if not (ROOT / path).exists()]
    unlisted = []
    for folder in sorted({path.parent for path in entries if path.suffix == ".py"}):
        for module in sorted((ROOT / folder).glob("*.py")):
            if module.name != "__init__.py" and folder / module.name not in entries:
                unlisted.append(str(folder / module.name))
        for package in sorted((ROOT / folder).glob("*/__init__.py")):
            if folder / package.parent.name not in entries:
                unlisted.append(str(folder / package.parent.name))
    # A folder the map sums up in one line names its modules there, if at all.
    for folder, description in entries.items():
        if folder.suffix != ".py" and not any(path.parent == folder for path in entries):
            for name in re.findall(r"\b\w+\.py\b", description):
                if not (ROOT / folder / name).exists():
                    missing.append(str(folder / name))
    assert (missing, unlisted) == ([], [])


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def test_every_relative_link_leads_somewhere():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"\w+://", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path) if path else page
            if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []
