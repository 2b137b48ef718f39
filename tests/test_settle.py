"""`check --settle`: the cases whose timings a stored check leaves open, judged side by side.

A stored baseline is one session of the runner and a check another; on the project's
2-core runner the offset between two sessions is as large as the slowdowns the gate is
asked to catch, so a stored check of a 10 % slowdown can end over its bound without
credible evidence and pass, and a baseline from a fast session can fail unchanged code.
The cases with a timing over its bound, and nothing exact against them, are measured
again beside the base revision (`perfguard.decision.gate.open_cases`), and the relative
verdict counts for them (`perfguard.storage.reports.settle`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from perfguard.decision.comparison import Rule
from perfguard.decision.estimate import DIFFERENT, UNKNOWN, PairedEstimate
from perfguard.decision.gate import open_cases
from perfguard.decision.verdict import ERROR, PASS, REGRESSION, Judgement, judge
from perfguard.presentation.render import render_markdown, settled_lines
from perfguard.results import CaseResult, Results
from perfguard.storage.baseline import new_baseline, scenario_from_result
from perfguard.storage.reports import Report, merge, read_report, settle
from tests.helpers import ENV, FACTORY, PG, QUICK, VIRTUAL_PIPES, worktrees


def processes(slower: float, seed: int) -> CaseResult:
    """Three processes of five runs of case `c`, the processes 2 % apart, the runs 0.5 %."""
    rng = np.random.default_rng(seed)
    runs = 60.0 * slower * np.repeat(1 + 0.02 * rng.standard_normal(3), 5)
    runs *= 1 + 0.005 * rng.standard_normal(15)
    samples = {
        "e2e": [float(x) + 40.0 for x in runs],
        "stage:DenoisingStage": list(map(float, runs)),
    }
    return CaseResult(case_id="c", samples=samples, repeats=15, groups=[5, 5, 5])


def judged(slower: float, alpha: float) -> Judgement:
    base = new_baseline(ENV).with_scenario("c", scenario_from_result(processes(1.0, seed=1)))
    results = Results(ENV, {}, {"c": processes(slower, seed=2)})
    return judge(results, base, rule=Rule(alpha=alpha))


def test_open_cases_are_those_over_a_bound_with_nothing_exact_against_them() -> None:
    # Three processes a side, 10 % over the baseline: over its 3 % bound; at a level no
    # interval can reach it passes, and is open.
    unsure = judged(1.10, alpha=1e-12)
    assert unsure.cases[0].verdict == PASS and unsure.cases[0].over
    assert open_cases(unsure) == ["c"]
    # Within its bound: nothing to settle.
    assert open_cases(judged(1.0, alpha=0.01)) == []
    # Credibly slower on its timings alone: still a timing, settled too (a baseline
    # from a fast session fails unchanged code credibly).
    sure = judged(1.30, alpha=0.01)
    assert sure.cases[0].verdict == REGRESSION and open_cases(sure) == ["c"]
    # An exact counter that grew is a fact: that case keeps its regression.
    case = sure.cases[0]
    grown = dataclasses.replace(case.metrics[0], metric="ops:DenoisingStage", verdict=REGRESSION)
    exact = dataclasses.replace(case, metrics=(*case.metrics, grown))
    assert open_cases(dataclasses.replace(sure, cases=(exact,))) == []
    errored = dataclasses.replace(case, verdict=ERROR)
    assert open_cases(dataclasses.replace(sure, cases=(errored,))) == []


def report_of(judgement: Judgement, **extra) -> Report:
    return Report(
        judgement=judgement,
        environment={"platform": "cpu", "hardware": "x"},
        baseline={"path": "b.json", "sha256": "0" * 64},
        profile={"rel": {}, "abs": {}},
        settings={"source": "run"},
        improvement_threshold=0.2,
        **extra,
    )


def side_by_side(
    judgement: Judgement, decision: str = DIFFERENT, low: float = 0.9, high: float = 1.5
) -> Judgement:
    """`judgement` as a relative check would give it: each metric with a paired estimate
    (`decision` and the bounds `low`-`high` for every one)."""
    cases = tuple(
        dataclasses.replace(
            c,
            metrics=tuple(
                dataclasses.replace(
                    m, paired=PairedEstimate(8, m.ratio or 1.0, low, high, 0.03, 0.01, decision)
                )
                for m in c.metrics
            ),
        )
        for c in judgement.cases
    )
    return dataclasses.replace(judgement, profile="relative", cases=cases)


AGAINST = {"dir": "/base", "commit": "a" * 40, "blocks": 6, "stopped": "clear"}


def test_the_relative_verdict_counts_and_the_stored_one_is_kept_beside_it() -> None:
    stored = report_of(judged(1.10, alpha=1e-12))
    against = AGAINST
    relative = report_of(side_by_side(judged(1.30, alpha=0.01)), against=against)
    assert stored.exit_code == 0
    out = settle(stored, relative)
    assert out.exit_code == 1 and out.cases[0].verdict == REGRESSION
    assert out.settled is not None and out.settled["against"] == against
    assert out.settled["cases"]["c"]["verdict"] == PASS
    assert out.against is None  # still a check against a stored baseline
    again = Report.from_json(json.loads(json.dumps(out.to_json())))
    assert again.settled == out.settled and again.exit_code == 1
    (line,) = settled_lines(out)
    assert line.startswith("c: pass against the baseline") and line.endswith(": regression")
    assert "stage:DenoisingStage 1.080x not credibly" in line and f"commit {'a' * 12}" in line
    assert "Settled side by side with the base" in render_markdown(out)
    # Shards merge: the settled cases of each, the exit code of all.
    other = report_of(Judgement("pr_test", (dataclasses.replace(stored.cases[0], case_id="d"),)))
    merged = merge([out, other], ["a.json", "b.json"])
    assert merged.exit_code == 1 and [c.case_id for c in merged.cases] == ["c", "d"]
    assert merged.settled is not None and list(merged.settled["cases"]) == ["c"]
    # A case the relative check did not judge keeps its stored verdict.
    assert (
        settle(stored, dataclasses.replace(relative, judgement=Judgement("relative", ())))
        .cases[0]
        .verdict
        == PASS
    )


def test_an_open_case_on_several_devices_keeps_its_stored_verdict(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A relative check runs on one device: an open case of two devices is named and left
    as the stored check judged it, and nothing is measured."""
    from perfguard import api
    from perfguard.cli import check as cli_check
    from perfguard.decision.gate import JudgeOptions
    from perfguard.storage.cases import Case

    stored = report_of(judged(1.10, alpha=1e-12))
    double = Case(id="c", workload="qwen_image", preset="tiny", num_devices=2)
    cpu = api.probe("cpu")
    monkeypatch.setattr(api, "probe", lambda name: cpu)
    monkeypatch.setattr(api, "select_cases", lambda *a, **k: [double])

    def measured(*args: object, **kwargs: object) -> None:
        raise AssertionError("nothing may be measured")

    monkeypatch.setattr(api, "check_relative", measured)
    out = cli_check._settled(
        stored, "cpu", api.Selection("cases", ("c",)), api.MeasureOptions(),
        JudgeOptions(), None,  # type: ignore[arg-type]
    )  # fmt: skip
    assert out is stored and out.settled is None
    assert capsys.readouterr().err.strip() == (
        "perfguard: c is open but runs on several devices: not settled"
    )


def test_a_side_by_side_check_that_left_an_open_metric_unresolved_settles_nothing() -> None:
    """Stopped at its budget with the stored check's open metric still UNKNOWN, a
    relative check passes it with a note: no answer to set against a stored regression."""
    stored = report_of(judged(1.30, alpha=0.01))
    relative = report_of(side_by_side(judged(1.0, alpha=0.01), UNKNOWN), against=AGAINST)
    out = settle(stored, relative)
    assert out.exit_code == 1 and out.cases[0].verdict == REGRESSION
    assert out.settled is not None and out.settled["cases"] == {}
    assert list(out.settled["unresolved"]) == ["c"]
    (line,) = settled_lines(out)
    assert line.startswith("c: regression against the baseline")
    assert line.endswith("unresolved when the check stopped: the stored verdict stands")
    assert Report.from_json(json.loads(json.dumps(out.to_json()))).settled == out.settled


def test_an_unresolved_interval_wholly_under_the_stored_reading_settles_it() -> None:
    """A stored regression that side by side reads ~1.00x, unresolved at the block cap
    but with every open figure's upper bound under its stored ratio, was the sessions'
    offset: the side-by-side pass counts. One figure whose interval still reaches its
    stored ratio, or that reads over the minimum effect, leaves the stored verdict."""
    stored = report_of(judged(1.30, alpha=0.01))
    ratios = {m.metric: m.ratio for m in stored.cases[0].metrics}
    assert (ratios["e2e"] or 0) < 1.25 < (ratios["stage:DenoisingStage"] or 0)
    under = side_by_side(judged(1.0, alpha=0.01), UNKNOWN, low=0.96, high=1.04)
    out = settle(stored, report_of(under, against=AGAINST))
    assert out.exit_code == 0 and out.cases[0].verdict == PASS
    assert out.settled is not None and list(out.settled["cases"]) == ["c"]
    (line,) = settled_lines(out)
    assert line.endswith(
        ": pass (e2e 0.989x, at most 1.040x, stage:DenoisingStage 0.982x, at most 1.040x: "
        "under the stored reading)"
    ), line
    reaching = side_by_side(judged(1.0, alpha=0.01), UNKNOWN, low=0.96, high=1.25)
    out = settle(stored, report_of(reaching, against=AGAINST))
    assert out.exit_code == 1 and out.cases[0].verdict == REGRESSION
    assert out.settled is not None and list(out.settled["unresolved"]) == ["c"]
    # Side by side slower by more than the minimum effect, if not credibly: under the
    # stored ratio, but a slowdown of the size the gate looks for. The stored one stands.
    slower = side_by_side(judged(1.10, alpha=1e-12), UNKNOWN, low=0.99, high=1.12)
    assert slower.cases[0].verdict == PASS
    assert all((m.ratio or 0) > 1.03 for m in slower.cases[0].metrics if m.metric in ratios)
    assert settle(stored, report_of(slower, against=AGAINST)).exit_code == 1
    # A figure the stored check had over its bound but passed (not credibly over) is
    # answered by a side-by-side reading within the minimum effect: e2e's interval
    # reaches its stored ratio, but neither check shows it slower.
    case = stored.cases[0]
    passed = tuple(
        dataclasses.replace(m, verdict=PASS) if m.metric == "e2e" else m for m in case.metrics
    )
    soft = dataclasses.replace(stored, judgement=dataclasses.replace(
        stored.judgement, cases=(dataclasses.replace(case, metrics=passed),)
    ))  # fmt: skip
    assert soft.cases[0].over == case.over and soft.cases[0].verdict == REGRESSION
    wide = side_by_side(judged(1.0, alpha=0.01), UNKNOWN, low=0.96, high=1.20)
    assert settle(stored, report_of(wide, against=AGAINST)).exit_code == 1
    assert settle(soft, report_of(wide, against=AGAINST)).exit_code == 0


# ---- the command ----------------------------------------------------------------------------


def gen_baseline(pg: PG, path: str) -> None:
    code, out, err = pg(
        "gen-baselines", *QUICK, *FACTORY, "--timing", "raw", "--processes", "3",
        "--baseline", path,
    )  # fmt: skip
    assert code == 0, out + err
    # The check imports the pipeline module again: the working tree's, as changed since.
    sys.modules.pop("pg_rel_pipes", None)


SETTLE = ("--settle", "--against-ref", "HEAD", "--timing", "raw", "--min-blocks", "4")


def test_an_open_case_is_settled_side_by_side_with_its_base(project: Path, pg: PG) -> None:
    """The working tree is 10 % slower than HEAD. At a stored level no interval can reach
    the stored check leaves the case open; the relative check against HEAD (a temporary
    worktree, removed afterwards) calls it a regression, and that is the verdict."""
    gen_baseline(pg, "b.json")
    (project / "pg_rel_pipes.py").write_text(VIRTUAL_PIPES.format(slow=1.10))
    code, out, err = pg(
        "check", *QUICK, *FACTORY, "--baseline", "b.json", "--alpha", "1e-12",
        "--max-reruns", "0", *SETTLE, "--max-blocks", "4", "--report", "r.json",
        "--markdown", "r.md",
    )  # fmt: skip
    assert code == 1, out + err
    report = json.loads(Path("r.json").read_text())
    case = report["cases"]["qwen_image_t2i_smoke"]
    assert "(qwen_image_t2i_smoke): settling them side by side with the base" in err
    assert report["settled"]["cases"]["qwen_image_t2i_smoke"]["verdict"] == "pass"
    assert report["settled"]["against"]["ref"] == "HEAD"
    den = case["metrics"]["stage:DenoisingStage"]
    assert den["verdict"] == "regression" and den["ratio_low"] > 1.0
    assert read_report("r.json").exit_code == 1  # validates against the schema
    assert "Settled side by side with the base" in Path("r.md").read_text()
    assert "settled side by side with the base, relative to HEAD" in " ".join(out.split())
    assert len(worktrees(project)) == 1


def test_a_baseline_from_a_fast_session_does_not_fail_unchanged_code(project: Path, pg: PG) -> None:
    """The baseline was measured while the code ran 10 % faster than HEAD does (a fast
    session, on a virtual clock): the stored check calls unchanged code a credible
    regression; side by side with HEAD it is the same, and the check passes."""
    (project / "pg_rel_pipes.py").write_text(VIRTUAL_PIPES.format(slow=0.90))
    gen_baseline(pg, "b.json")
    (project / "pg_rel_pipes.py").write_text(VIRTUAL_PIPES.format(slow=1.0))
    code, out, err = pg(
        "check", *QUICK, *FACTORY, "--baseline", "b.json", *SETTLE, "--max-blocks", "16",
        "--report", "r.json",
    )  # fmt: skip
    assert code == 0, out + err
    report = json.loads(Path("r.json").read_text())
    stored = report["settled"]["cases"]["qwen_image_t2i_smoke"]
    assert stored["verdict"] == "regression"
    assert stored["metrics"]["stage:DenoisingStage"]["verdict"] == "regression"
    den = report["cases"]["qwen_image_t2i_smoke"]["metrics"]["stage:DenoisingStage"]
    assert den["verdict"] == "pass" and den["ratio_low"] < 1.03
    assert "qwen_image_t2i_smoke: regression against the baseline" in " ".join(out.split())


def test_nothing_is_settled_when_no_case_is_open(project: Path, pg: PG) -> None:
    gen_baseline(pg, "b.json")
    code, out, err = pg(
        "check", *QUICK, *FACTORY, "--baseline", "b.json", *SETTLE, "--report", "r.json",
    )  # fmt: skip
    report = json.loads(Path("r.json").read_text())
    assert code == 0, out + err
    assert "settled" not in report and "settling" not in err and "relative check" not in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--settle",), "--settle needs --against DIR or --against-ref REF"),
        (("--settle", "--against", "nowhere"), "--against nowhere: no such directory"),
        (("--settle", "--against-ref", "no-such-ref"), "--against-ref no-such-ref: no such commit"),
        (
            ("--settle", "--against-ref", "HEAD", "--counters-only"),
            "--settle runs the open cases again",
        ),
        (
            ("--settle", "--against-ref", "HEAD", "--write-baseline", "w.json"),
            "--write-baseline does not apply to --settle",
        ),
    ],
)
def test_a_bad_settle_is_one_line_and_exit_2_before_anything_runs(
    project: Path,
    pg: PG,
    args: tuple[str, ...],
    message: str,
) -> None:
    code, _, err = pg(
        "check", *QUICK, *FACTORY, "--baseline", "b.json", *args, "--report", "r.json"
    )
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert not Path("r.json").exists()
