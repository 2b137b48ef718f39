"""What a runner resolves, and the timing gate: a noisy runner's baseline records its
resolution, a check against it judges the unresolvable figures only for *slower* (exit 0
unless proven slower), and a quiet runner's figures keep the three answers
(perfguard/decision/resolution.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from perfguard.decision import answer as answers
from perfguard.decision.options import DEFAULT_MAX_RERUNS
from perfguard.decision.resolution import (
    ADVISE,
    AUTO,
    CHECK_PROCESSES,
    GATE,
    RESOLVABLE,
    judged_in_full,
    of_scenario,
    resolution,
)
from perfguard.decision.stats import summarize
from perfguard.decision.tolerances import Band
from perfguard.decision.verdict import judge
from perfguard.presentation.markdown import render_markdown
from perfguard.presentation.summary import summary_line
from perfguard.results import CaseResult, Results
from perfguard.storage.baseline import new_baseline
from perfguard.storage.refresh import scenario_from_result, with_resolution
from tests.fake_pipeline import CHECK, GEN
from tests.helpers import ENV, PG, noisy, report_of

CASE = "qwen_image_t2i_smoke"


def _session(
    between: float, scale: float = 1.0, seed: int = 0, processes: int = 10, within: float = 0.01
) -> CaseResult:
    """`processes` processes of 5 runs each: a denoising stage of 20 ms whose process
    medians spread by `between` (log sd), `within` inside each, times `scale`; e2e 3 ms
    more."""
    import random

    rng = random.Random(seed)
    den: list[float] = []
    for p in range(processes):
        level = 20.0 * scale * math.exp(rng.gauss(0.0, between))
        den += noisy(level, within, 5, seed=seed * 100 + p)
    return CaseResult(
        case_id=CASE,
        samples={"stage:DenoisingStage": den, "e2e": [d + 3.0 for d in den]},
        repeats=len(den),
        groups=[5] * processes,
        output_hash="abc",
        deterministic=True,
    )


GPU = {**ENV, "platform": "cuda", "hardware": "test-gpu"}
"""A device runner: no session term (`tolerances.SESSION_SD` is the CPU runner's)."""


def _judge(base: CaseResult, current: CaseResult, timing_gate: str = AUTO, env=ENV):
    baseline = new_baseline(env)
    baseline = baseline.with_scenario(CASE, with_resolution(scenario_from_result(base), baseline))
    results = Results(environment=env, settings={}, cases={CASE: current})
    return baseline, judge(results, baseline, "pr_test", timing_gate=timing_gate)


def test_resolution_follows_the_spread_between_processes() -> None:
    quiet = summarize(
        _session(0.003, within=0.003).samples["stage:DenoisingStage"], groups=[5] * 10
    )
    noisy_ = summarize(_session(0.20).samples["stage:DenoisingStage"], groups=[5] * 10)
    band = Band(0.03, 0.0)
    q = resolution(quiet, band, alpha=0.001, session_sd=0.0)
    n = resolution(noisy_, band, alpha=0.001, session_sd=0.007)
    assert q is not None and n is not None
    assert q < RESOLVABLE * 0.03 < n  # quiet: within 4/3 d; noisy: beyond
    # More processes resolve more, and a check of one process less than of the default.
    more = resolution(noisy_, band, alpha=0.001, session_sd=0.007, processes=30)
    one = resolution(noisy_, band, alpha=0.001, session_sd=0.007, processes=1)
    assert more is not None and one is not None and more < n < one
    assert CHECK_PROCESSES == 1 + DEFAULT_MAX_RERUNS


def test_the_three_settings() -> None:
    assert judged_in_full(GATE, 5.0, 0.03) and judged_in_full(AUTO, 0.035, 0.03)
    assert not judged_in_full(AUTO, 0.05, 0.03) and not judged_in_full(ADVISE, 0.01, 0.03)
    assert judged_in_full(AUTO, None, 0.03)  # no spread known: the band decides, as before
    with pytest.raises(ValueError, match="timing gate must be one of"):
        judged_in_full("sometimes", 0.1, 0.03)


def test_unchanged_code_on_a_noisy_runner_is_below_resolution_and_exits_0() -> None:
    baseline, judgement = _judge(_session(0.20, seed=1), _session(0.20, seed=2, processes=3))
    case = judgement.cases[0]
    stage = next(m for m in case.metrics if m.metric == "stage:DenoisingStage")
    assert stage.answer is not None and stage.answer.answer == answers.UNRESOLVED
    assert stage.answer.resolution is not None and stage.answer.resolution > RESOLVABLE * 0.03
    assert judgement.exit_code == 0 and judgement.answer == answers.UNRESOLVED
    # What gen-baselines recorded is what the check used.
    recorded = baseline.scenarios[CASE].resolution
    assert recorded is not None
    assert recorded["denoise_stage"] == pytest.approx(stage.answer.resolution, abs=1e-4)
    # The same data under `gate` can't tell (exit 4), as before this setting existed.
    _, gated = _judge(_session(0.20, seed=1), _session(0.20, seed=2, processes=3), GATE)
    assert gated.exit_code == 4


def test_a_proven_slowdown_fails_on_any_runner() -> None:
    _, judgement = _judge(_session(0.20, seed=1), _session(0.20, 2.0, seed=3, processes=6))
    stage = next(m for m in judgement.cases[0].metrics if m.metric == "stage:DenoisingStage")
    assert stage.answer is not None and stage.answer.answer == answers.SLOWER
    assert judgement.exit_code == 1


def test_a_quiet_runner_keeps_the_three_answers() -> None:
    """A device's figures spread 0.3 %, no session term: every figure in full."""
    base, check = (
        _session(0.003, seed=1, within=0.003),
        _session(0.003, seed=2, processes=3, within=0.003),
    )
    _, judgement = _judge(base, check, env=GPU)
    kinds = {m.answer.answer for m in judgement.cases[0].metrics if m.answer is not None}
    assert answers.UNRESOLVED not in kinds and judgement.exit_code in (0, 4)
    _, advised = _judge(base, check, ADVISE, env=GPU)
    kinds = {m.answer.answer for m in advised.cases[0].metrics if m.answer is not None}
    assert kinds == {answers.UNRESOLVED} and advised.exit_code == 0


def test_the_first_line_and_the_markdown_say_what_the_runner_resolves() -> None:
    baseline, judgement = _judge(_session(0.20, seed=1), _session(0.20, seed=2, processes=3))
    report = report_of(judgement, baseline)
    line = summary_line(report)
    assert line.startswith("perfguard PASS") and "exit 0" in line
    assert "timing: this runner resolves about +" in line and "not judged below that" in line
    md = render_markdown(report)
    assert "Below resolution (" in md and "below resolution (resolves +" in md


def test_of_scenario_gives_each_timed_class() -> None:
    baseline = new_baseline(ENV)
    scenario = scenario_from_result(_session(0.05))
    found = of_scenario(scenario, baseline.profile("pr_test"))
    assert set(found) == {"e2e", "denoise_stage"} and all(v > 0 for v in found.values())


def test_the_timing_gate_is_one_setting_of_the_pyproject_table(
    fake: Path, pg: PG, tmp_path: Path
) -> None:
    assert pg(*GEN)[0] == 0
    (tmp_path / "pyproject.toml").write_text('[tool.perfguard]\ntiming-gate = "gate"\n')
    assert pg(*CHECK, "--report", "r.json")[0] in (0, 4)
    assert json.loads(Path("r.json").read_text())["settings"]["timing_gate"] == "gate"
    assert pg(*CHECK, "--report", "r.json", "--timing-gate", "advise")[0] == 0
    assert json.loads(Path("r.json").read_text())["settings"]["timing_gate"] == "advise"
    (tmp_path / "pyproject.toml").write_text('[tool.perfguard]\ntiming-gate = "sometimes"\n')
    code, _, err = pg(*CHECK, "--report", "r.json")
    assert code == 2 and "timing-gate" in err and len(err.strip().splitlines()) == 1


def test_baselines_show_says_what_a_check_resolves(pg: PG, tmp_path: Path) -> None:
    from perfguard.storage.baseline import save

    baseline, _ = _judge(_session(0.20, seed=1), _session(0.20, seed=2, processes=3))
    path = tmp_path / "b.json"
    save(path, baseline)
    code, out, _ = pg("baselines", "show", str(path))
    text = " ".join(out.split())
    assert code == 0 and "a check resolves e2e +" in text
    assert "denoise_stage +" in text and "(below: slower only)" in text


def test_a_url_server_case_records_the_server_term_in_its_resolution() -> None:
    """A `url` server's rounds share one server: the check adds its offset
    (`tolerances.SERVER_SESSION_SD`), so the recorded resolution does too."""
    import dataclasses

    profile = new_baseline(ENV).profile("pr_test")
    plain = scenario_from_result(_session(0.01))
    served = dataclasses.replace(plain, case={"workload": "server", "url": "http://127.0.0.1:1"})
    assert of_scenario(served, profile)["e2e"] > 2 * of_scenario(plain, profile)["e2e"]
