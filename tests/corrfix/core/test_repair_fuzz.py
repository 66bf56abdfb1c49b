"""The repair machine under random and damaged input: its invariants hold after every call.

``test_repair.py`` proves the repair semantics against an honest-but-lossy broker with
well-formed frames. This adds what a hostile peer can send: damaged and noise requests,
stray and truncated answers, answers out of order, arbitrary time jumps. See
``repair_fuzz.py`` for the harness; ``bench/fuzz.py`` runs it 10⁶ times.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from corrfix.core import _repair as repair
from corrfix.lab import run_repair_case
from protocol import RESPONSE_CORRELATION_OFFSET

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(rnd=st.randoms(use_true_random=False))
def test_hostile_peers_never_break_the_invariants(rnd):
    run_repair_case(rnd)


# Seeded rather than drawn: 400 steps of draws exceed hypothesis's buffer, and a seed replays exactly.
@settings(max_examples=15, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(seed=st.integers(0, 2**64 - 1))
def test_long_hostile_runs_never_break_the_invariants(seed):
    run_repair_case(random.Random(seed), steps=400)


def test_every_ending_is_reached():
    """With a fixed seed the fuzzer reaches each way a case can end, so none goes unchecked."""
    endings: Counter[str] = Counter()
    for seed in range(400):
        harness = run_repair_case(random.Random(seed))
        if harness.rejected is not None:
            endings["rejected"] += 1
        elif harness.closed is not None:
            endings["closed"] += 1
        else:
            endings["settled"] += 1
        endings["sasl raw tokens"] += harness.sasl_raw
        endings["answers delivered"] += harness.delivered > 0
    for ending in ("rejected", "closed", "settled", "sasl raw tokens", "answers delivered"):
        assert endings[ending] >= 5, endings


def test_the_harness_catches_an_answer_given_to_the_wrong_request(monkeypatch):
    """A machine that forgets to restore the client's id must fail the fuzzer: the checks bite."""
    write_id = repair._write_id

    def write_request_ids_only(frame, offset, correlation_id):
        if offset != RESPONSE_CORRELATION_OFFSET:
            write_id(frame, offset, correlation_id)

    monkeypatch.setattr(repair, "_write_id", write_request_ids_only)
    with pytest.raises(AssertionError):
        for seed in range(200):
            run_repair_case(random.Random(seed))
