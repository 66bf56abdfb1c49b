"""Argument types shared by the command line and the TOML config: each names what it wants.

Every converter raises ``argparse.ArgumentTypeError`` with the offending text, so a bad
flag and a bad config value read the same way.
"""

from __future__ import annotations

import argparse
import math

_UNITS = {"k": 1024, "m": 1024**2, "g": 1024**3}


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def count(text: str) -> int:
    """A whole number, 0 meaning off."""
    value = _whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 (off) or a positive count, got {value}")
    return value


def at_least_one(text: str) -> int:
    """A whole number above zero (processes to run), where 0 or less would mean nothing."""
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def port(text: str) -> int:
    """A TCP port, 1 to 65535."""
    value = _whole(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535, got {value}")
    return value


def probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a probability, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a probability is between 0 and 1, got {value}")
    return value


def seconds(text: str) -> float:
    """A non-negative, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative number of seconds, got {text!r}")
    return value


def positive(text: str) -> float:
    """A finite number above zero (a speed factor, a timeout)."""
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def size(text: str) -> int:
    """Bytes, optionally with a binary suffix: ``65536``, ``64k``, ``256M``, ``1G``."""
    value = text.strip().lower().removesuffix("ib").removesuffix("b")
    scale = _UNITS.get(value[-1:], 1)
    if scale != 1:
        value = value[:-1]
    try:
        result = int(value) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a size in bytes (e.g. 65536, 64k, 256M), got {text!r}"
        ) from None
    if result < 0:
        raise argparse.ArgumentTypeError(f"size must be >= 0, got {text!r}")
    return result


def positive_size(text: str) -> int:
    value = size(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value
