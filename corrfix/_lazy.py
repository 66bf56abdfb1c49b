"""Names a package exports but loads on first use, so importing it costs only what is used."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) that imports ``homes[name]`` (relative to
    ``package``) when ``name`` is first read, and keeps the value in the package."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(home, package)
        value = module if module.__name__.rpartition(".")[2] == name else getattr(module, name)
        setattr(importlib.import_module(package), name, value)
        return value

    return __getattr__
