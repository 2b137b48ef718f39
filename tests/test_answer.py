"""The three answers on one figure: same, slower, can't tell, and the slowdown it could
have caught (perfguard/decision/answer.py), worked against figures computed by hand."""

from __future__ import annotations

import math

import pytest

from perfguard.decision.answer import (
    CANT_TELL,
    FASTER,
    SAME,
    SLOWER,
    Answer,
    Criteria,
    assess,
    exact,
    log_se,
    worst,
)
from perfguard.decision.stats import satterthwaite


def test_same_needs_the_upper_bound_inside_the_margin() -> None:
    # se 1 %, normal quantile 1.645: the upper bound is 1.005 * e^0.01645 = 1.0217 < 1.03
    a = assess(1.005, 0.01, 0, Criteria(0.001, 1.03, 0.03), slower=False)
    assert a.answer == SAME and a.high == pytest.approx(1.005 * math.exp(0.01645), rel=1e-3)
    # the same figure read at 1.015: 1.0316 > 1.03, and it is not slower: can't tell
    b = assess(1.015, 0.01, 0, Criteria(0.001, 1.03, 0.03), slower=False)
    assert b.answer == CANT_TELL and b.needs == pytest.approx(0.0316, abs=1e-3)


def test_the_detectable_slowdown_is_the_rules_reach_plus_the_power_quantile() -> None:
    # reach = max(log 1.03, 3.090 * 0.02) = 0.0618; + 0.8416 * 0.02 -> e^0.0786 - 1 = 8.2 %
    a = assess(1.0, 0.02, 0, Criteria(0.001, 1.03, 0.03), slower=False)
    assert a.detectable == pytest.approx(math.exp(3.0902 * 0.02 + 0.8416 * 0.02) - 1, rel=1e-3)
    # a quiet figure: the band's 3 % is the reach, 80 % power needs 3 % + 0.84 se
    q = assess(1.0, 0.001, 0, Criteria(0.001, 1.03, 0.03), slower=False)
    assert q.detectable == pytest.approx(1.03 * math.exp(0.8416 * 0.001) - 1, rel=1e-3)


def test_slower_and_faster_come_from_the_rule_and_work_is_exact() -> None:
    s = assess(1.2, 0.01, 0, Criteria(0.001, 1.03, 0.03), slower=True)
    assert s.answer == SLOWER
    f = assess(0.7, 0.01, 0, Criteria(0.001, 1.03, 0.03), slower=False, faster=True)
    assert f.answer == FASTER
    assert exact(True).answer == SLOWER and exact(False).answer == SAME
    assert exact(False).detectable is None  # a count has no noise to catch through
    assert worst([SAME, FASTER]) == SAME and worst([SAME, CANT_TELL, FASTER]) == CANT_TELL
    assert worst([CANT_TELL, SLOWER]) == SLOWER and worst([]) is None


def test_too_little_data_is_never_the_same() -> None:
    a = assess(1.0, 0.001, 0, Criteria(0.001, 1.03, 0.03), slower=False, enough_processes=False)
    assert a.answer == CANT_TELL


def test_a_known_term_does_not_pay_for_few_degrees_of_freedom() -> None:
    # se^2 = 0.005^2 estimated on 2 dof + 0.0141^2 known: Welch-Satterthwaite gives ~128
    # dof, so the quantile is ~1.66, not t(0.05, 2) = 2.92
    se = math.sqrt(0.005**2 + 0.0141**2)
    dof = satterthwaite(se, 0.0141, 2)
    a = assess(1.0, se, dof, Criteria(0.001, 1.03, 0.03), slower=False)
    assert a.answer == SAME and a.high == pytest.approx(math.exp(1.657 * se), rel=2e-3)
    b = assess(1.0, se, 2, Criteria(0.001, 1.03, 0.03), slower=False)
    assert b.answer == CANT_TELL  # the same figures, all of it estimated on 2 dof


def test_an_answer_reads_back_from_its_json_and_se_from_an_interval() -> None:
    a = assess(1.01, 0.02, 8, Criteria(0.01, 1.03, 0.03), slower=False)
    assert Answer.from_json(a.to_json()).answer == a.answer
    # a lower bound from t(0.01, 8) = 2.896 and se 0.02 gives that se back
    low = 1.01 * math.exp(-2.896 * 0.02)
    assert log_se(1.01, low, 0.01, 8) == pytest.approx(0.02, rel=1e-3)
    huge = assess(1.0, 40.0, 1, Criteria(0.001, 1.03, 0.03), slower=False)
    assert huge.answer == CANT_TELL and math.isfinite(huge.high or 0.0)
