"""Fitted-exponent verdicts decided by an equivalence test: reproduced inside target ± δ,
not reproduced when the interval excludes the target, inconclusive otherwise (a small
study with a wide interval must not pass)."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from hpcpipe.studies import dimension
from hpcpipe.studies.common import StudyResult, equivalence, equivalence_verdict


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        (0.24, 0.26, True),  # inside 1/4 ± 0.03
        (0.22, 0.28, True),  # the band itself
        (0.255, 0.265, True),  # excludes 1/4 but is 1/4 to within δ: equivalence decides
        (0.256, 0.281, False),  # the shipped 15-run study: excludes 1/4
        (0.10, 0.24, False),
        (0.164, 0.469, None),  # the 6-run study a new user ran: contains 1/4, too wide
        (0.24, 0.29, None),  # contains 1/4, narrower than the band but reaching out of it
        (math.nan, math.nan, None),  # two points: no interval
    ],
)
def test_equivalence_rule(lo, hi, expected):
    assert equivalence(lo, hi, 0.25, 0.03) is expected


def _units(dims, seeds, exponent, noise):
    """Fake tuned dimension-study runs: n = 40·d^exponent·noise, one per (d, seed)."""
    by, it = {}, iter(noise)
    for d in dims:
        by[(d, "c4")] = [
            SimpleNamespace(
                d=d,
                n=40 * d**exponent * next(it),
                n_min=1.0,
                rec=SimpleNamespace(file=f"d{d}-s{s}"),
            )
            for s in seeds
        ]
    return by, {d: "c4" for d in dims}


def _price_row(by, tuned):
    res = StudyResult(dimension.NAME)
    dims = sorted(tuned)
    dimension._price(res, by, dims, tuned)
    (row,) = res.verdicts
    return row


def test_planted_too_small_study_is_inconclusive():
    """Six runs at three d with instance-to-instance spread: the interval holds 1/4 and
    much else; the old rule ("the interval contains 0.25") called this reproduced."""
    by, tuned = _units((16, 64, 256), (0, 1), 0.316, [1.0, 1.3, 0.75, 1.25, 0.8, 1.2])
    row = _price_row(by, tuned)
    lo, hi = (float(t) for t in row.measured.split("[")[1].split("]")[0].split(", "))
    assert lo <= 0.25 <= hi and hi - lo > 2 * dimension.EXPONENT_DELTA
    assert row.ok is None and row.word == "inconclusive"
    assert "(predicted 0.25)" in row.measured and "delta = 0.03" in row.bound


def test_a_large_study_at_one_quarter_is_reproduced_and_a_steeper_one_is_not():
    dims = tuple(2**k for k in range(4, 16))  # 12 dimensions
    g = np.random.default_rng(0)
    by, tuned = _units(dims, (0, 1, 2), 0.25, 1 + 0.02 * g.standard_normal(36))
    row = _price_row(by, tuned)
    assert row.ok is True and row.word == "reproduced", row.measured
    by, tuned = _units(dims, (0, 1, 2), 0.3, 1 + 0.02 * g.standard_normal(36))
    row = _price_row(by, tuned)
    assert row.ok is False and row.word == "not reproduced", row.measured


def test_a_bound_row_under_the_same_rule():
    """The smooth study's slope row is a bound: inside 1 ± δ within bound, excluding 1
    violated (fails the report), a wide interval inconclusive (does not)."""
    words = [
        equivalence_verdict("s", "c", "slope", 1.0, 0.2, fit, "", [], kind="bound").word
        for fit in ((1.0, 0.9, 1.1), (0.6, 0.5, 0.7), (1.0, 0.5, 1.5))
    ]
    assert words == ["within bound", "VIOLATED", "inconclusive"]


def test_an_interval_end_within_rounding_of_the_target_holds_it():
    """Resampled points that differ in one factor only give the exact slope, read as
    1 + 2e-16 on one CPU and 1 - 2e-16 on another: that end holds the target (the
    verdict is then decided by the band), while an end a millionth off excludes it."""
    for end in (1 + 2.2e-16, 1 - 2.2e-16, 1.0):
        assert equivalence(end, 1.35, 1.0, 0.2) is None  # holds 1, wider than the band
        assert equivalence(0.65, 2 - end, 1.0, 0.2) is None
    assert equivalence(1 + 1e-6, 1.35, 1.0, 0.2) is False
    assert equivalence(0.65, 1 - 1e-6, 1.0, 0.2) is False
    assert equivalence(1 + 2.2e-16, 1.1, 1.0, 0.2) is True
