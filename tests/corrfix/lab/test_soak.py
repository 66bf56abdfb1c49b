"""The chaos soak, small: three real clients through corrfix and a lossy, killing link to Tansu.

Nothing is lost, no client sees a mismatched answer, the idempotent producer stores
everything exactly once, and every duplicate of the non-idempotent producer is one the
capture flags as a possible duplicate. ``bench/soak.py`` runs the same with 100,000 messages.
"""

from __future__ import annotations

import pytest

from corrfix.lab import SoakPlan, run_soak

pytestmark = pytest.mark.broker


async def test_chaos_soak_loses_nothing_and_flags_every_duplicate(tmp_path):
    plan = SoakPlan(messages=3_000, kill_every=150, timeout=150.0)
    outcome = await run_soak(plan, tmp_path)
    assert outcome.problems() == []
    # The chaos really happened, and corrfix really repaired it.
    assert outcome.chaos["dropped"] >= 5
    assert outcome.chaos["duplicated"] >= 1
    assert outcome.chaos["killed"] >= 2
    assert outcome.repairs["requeue"] >= 1
    assert outcome.repairs["stale_drop"] >= outcome.chaos["duplicated"]
